"""Ray workers forked from the test worker's zygote (`nemo_rl_clone.distributed.worker_zygote`): the launcher must
look to Ray like the process it started, and the child like a fresh interpreter with the launcher's arguments,
environment, folder and streams. The suite's zygote (`_ray_worker_zygote` in tests/conftest.py) serves these."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import ray

from nemo_rl_clone.distributed.worker_zygote import SOCKET_ENV


@pytest.fixture(autouse=True)
def _needs_the_zygote() -> None:
    if SOCKET_ENV not in os.environ:  # set by the session fixture, after collection
        pytest.skip("NRL_TEST_WORKER_ZYGOTE=0: the suite started no zygote")


SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy, torch
    print(json.dumps({
        "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(), "argv": sys.argv,
        "env": os.environ.get("ZYGOTE_TEST"), "preloaded": "vllm" in sys.modules, "threads": torch.get_num_threads(),
        "numpy": int(numpy.random.randint(2**31)), "path0": sys.path[0], "extra": "/zygote/extra" in sys.path,
    }), flush=True)
    if sys.argv[1] == "wait":
        time.sleep(600)
    sys.exit(int(sys.argv[1]))
    """
)


def _launch(tmp_path, *args: str, env: dict[str, str] | None = None, socket: str = "") -> subprocess.Popen:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    socket = socket or os.environ[SOCKET_ENV]
    command = [sys.executable, "-m", "nemo_rl_clone.distributed.worker_zygote", "launch", socket]
    return subprocess.Popen(
        [*command, str(script), *args],
        cwd=tmp_path,
        env={**os.environ, "ZYGOTE_TEST": "yes", "PYTHONPATH": "/zygote/extra", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _zygote_pid() -> int:
    return next(
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if os.environ[SOCKET_ENV] in (p.info["cmdline"] or []) and "serve" in p.info["cmdline"]
    )


def test_the_child_runs_the_script_as_a_fresh_interpreter_would_and_its_exit_code_comes_back(tmp_path):
    runs = [_launch(tmp_path, "3", env={"OMP_NUM_THREADS": "1"}), _launch(tmp_path, "0")]
    outputs = [run.communicate(timeout=120) for run in runs]
    first, second = (json.loads(out.splitlines()[-1]) for out, _ in outputs)
    assert [run.returncode for run in runs] == [3, 0], outputs
    assert first["ppid"] == _zygote_pid() and first["preloaded"], first  # forked, not a plain start
    assert first["pid"] != runs[0].pid  # the child is not the launcher: Ray registers the child's pid
    assert first["cwd"] == str(tmp_path) and first["argv"] == [str(tmp_path / "script.py"), "3"]
    assert first["env"] == "yes" and first["extra"] and first["path0"] == str(tmp_path)
    assert first["threads"] == 1 and second["threads"] == len(os.sched_getaffinity(0))  # OMP_NUM_THREADS, or all
    assert first["numpy"] != second["numpy"]  # numpy's global generator is reseeded per child, as in a fresh process
    assert all(err == "" or "no zygote" not in err for _, err in outputs)


def test_a_signal_to_the_launcher_reaches_the_child_and_a_killed_launcher_leaves_no_child(tmp_path):
    run = _launch(tmp_path, "wait")
    assert run.stdout is not None
    child = psutil.Process(json.loads(run.stdout.readline())["pid"])
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=60) == -signal.SIGTERM  # the child died of it, and the launcher reports it the same way
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE

    run = _launch(tmp_path, "wait")
    assert run.stdout is not None
    child = psutil.Process(json.loads(run.stdout.readline())["pid"])
    run.kill()  # SIGKILL: nothing can be passed on; the child notices its launcher is gone
    run.wait(timeout=60)
    deadline = time.monotonic() + 30
    while child.is_running() and child.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE


def test_without_a_zygote_the_launcher_says_so_and_starts_the_script_itself(tmp_path):
    run = _launch(tmp_path, "4", socket=str(tmp_path / "none.sock"))
    out, err = run.communicate(timeout=120)
    assert run.returncode == 4, err
    assert "no zygote at" in err and "as a plain process" in err
    assert json.loads(out.splitlines()[-1])["ppid"] != _zygote_pid()


@ray.remote
class _Where:
    def where(self) -> tuple[int, int]:
        return os.getpid(), os.getppid()


def test_ray_registers_and_kills_the_forked_worker(ray_local):
    actor = _Where.remote()
    pid, parent = ray.get(actor.where.remote(), timeout=120)
    assert parent == _zygote_pid()
    ray.kill(actor)
    process = psutil.Process(pid)
    deadline = time.monotonic() + 30
    while process.is_running() and process.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
