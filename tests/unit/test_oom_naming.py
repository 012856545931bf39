"""A worker taken by an OOM killer is named as such: the kernel's (seen in the memory cgroup's kill counter) and Ray's
memory monitor (named in the death's message)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nemo_rl_clone.distributed.oom import oom_cause

REPO = Path(__file__).resolve().parents[2]

# Runs inside a memory cgroup of 256 MiB: notes the kill count, starts a process that needs 1 GiB, reports.
_VICTIM = textwrap.dedent(
    """
    import subprocess, sys
    from nemo_rl_clone.distributed.oom import oom_cause, remember_oom_kills
    remember_oom_kills()
    done = subprocess.run([sys.executable, "-c", "b = bytearray(1 << 30)"])
    print(done.returncode)
    print(oom_cause("The actor is dead because its worker process has died."))
    """
)


@pytest.fixture
def small_memory_cgroup():
    """A fresh memory cgroup with a 256 MiB limit and no swap (needs root and a writable cgroup tree)."""
    name = f"nrl_oom_test_{os.getpid()}"
    if Path("/sys/fs/cgroup/cgroup.controllers").is_file():  # v2
        group = Path("/sys/fs/cgroup") / name
        limits = {"memory.max": str(256 << 20), "memory.swap.max": "0"}
    else:
        group = Path("/sys/fs/cgroup/memory") / name
        limits = {"memory.limit_in_bytes": str(256 << 20), "memory.memsw.limit_in_bytes": str(256 << 20)}
    try:
        group.mkdir()
        for key, value in limits.items():
            if (group / key).exists():
                (group / key).write_text(value)
    except OSError as e:
        pytest.skip(f"cannot make a memory cgroup here ({e}): needs root and a writable cgroup tree")
    try:
        yield group
    finally:
        group.rmdir()


def test_the_kernels_oom_killer_is_named(small_memory_cgroup):
    procs = small_memory_cgroup / "cgroup.procs"
    done = subprocess.run(
        [sys.executable, "-c", _VICTIM],
        preexec_fn=lambda: procs.write_text("0"),  # the child joins the cgroup before it runs any Python
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    code, line = done.stdout.splitlines()
    assert code == "-9"  # SIGKILL from the kernel
    assert line.startswith(", killed by the kernel's OOM killer (its kill count in this cgroup rose from 0 to 1")


def test_rays_memory_monitor_is_named_from_its_message():
    ray_says = "Task was killed due to the node running low on memory. Memory on the node was 23.1GB used"
    assert oom_cause(ray_says) == ", killed by Ray's memory monitor (the node ran low on memory)"
