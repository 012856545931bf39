"""Ray workers forked from a zygote (`nemo_rl_clone.distributed.worker_zygote`): the launcher must look to Ray like
the process it started, and the child like a fresh interpreter with the launcher's arguments, environment, folder and
streams. The module starts its own zygote with a light preload (numpy): the mechanism is the same for vLLM's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import psutil
import pytest
import ray

from nemo_rl_clone.distributed.worker_zygote import launcher_command, start_zygote

PRELOADED = "numpy"


@pytest.fixture(scope="module")
def zygote() -> Iterator[tuple[str, int]]:
    """A zygote of this module's own: its socket path and pid."""
    path = f"/tmp/nrl-zygote-test-{os.getpid()}.sock"  # short: unix socket paths allow 107 characters
    process = start_zygote(path, preload=PRELOADED)
    yield path, process.pid
    process.terminate()
    assert process.wait(timeout=60) == 0
    assert not os.path.exists(path)


SCRIPT = textwrap.dedent(
    """
    import gc, json, os, sys, time
    PRELOADED_BEFORE = "numpy" in sys.modules
    import numpy, torch
    print(json.dumps({
        "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(), "argv": sys.argv,
        "env": os.environ.get("ZYGOTE_TEST"), "preloaded": PRELOADED_BEFORE, "threads": torch.get_num_threads(),
        "numpy": int(numpy.random.randint(2**31)), "path0": sys.path[0], "extra": "/zygote/extra" in sys.path,
        "frozen": gc.get_freeze_count(),
    }), flush=True)
    if sys.argv[1] == "wait":
        time.sleep(600)
    sys.exit(int(sys.argv[1]))
    """
)


def _launch(tmp_path, socket: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    return subprocess.Popen(
        [*launcher_command(socket).split(), str(script), *args],
        cwd=tmp_path,
        env={**os.environ, "ZYGOTE_TEST": "yes", "PYTHONPATH": "/zygote/extra", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_child_runs_the_script_as_a_fresh_interpreter_would_and_its_exit_code_comes_back(tmp_path, zygote):
    path, zygote_pid = zygote
    runs = [_launch(tmp_path, path, "3", env={"OMP_NUM_THREADS": "1"}), _launch(tmp_path, path, "0")]
    outputs = [run.communicate(timeout=120) for run in runs]
    first, second = (json.loads(out.splitlines()[-1]) for out, _ in outputs)
    assert [run.returncode for run in runs] == [3, 0], outputs
    assert first["ppid"] == zygote_pid and first["preloaded"], first  # forked, not a plain start
    assert first["pid"] != runs[0].pid  # the child is not the launcher: Ray registers the child's pid
    assert first["cwd"] == str(tmp_path) and first["argv"] == [str(tmp_path / "script.py"), "3"]
    assert first["env"] == "yes" and first["extra"] and first["path0"] == str(tmp_path)
    assert first["threads"] == 1 and second["threads"] == len(os.sched_getaffinity(0))  # OMP_NUM_THREADS, or all
    assert first["frozen"] > 1000  # the zygote's imported heap is out of the collector's reach (`gc.freeze`)
    assert first["numpy"] != second["numpy"]  # numpy's global generator is reseeded per child, as in a fresh process
    assert all(err == "" or "no zygote" not in err for _, err in outputs)


def test_a_signal_to_the_launcher_reaches_the_child_and_a_killed_launcher_leaves_no_child(tmp_path, zygote):
    run = _launch(tmp_path, zygote[0], "wait")
    assert run.stdout is not None
    child = psutil.Process(json.loads(run.stdout.readline())["pid"])
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=60) == -signal.SIGTERM  # the child died of it, and the launcher reports it the same way
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE

    run = _launch(tmp_path, zygote[0], "wait")
    assert run.stdout is not None
    child = psutil.Process(json.loads(run.stdout.readline())["pid"])
    run.kill()  # SIGKILL: nothing can be passed on; the child notices its launcher is gone
    run.wait(timeout=60)
    deadline = time.monotonic() + 30
    while child.is_running() and child.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE


def test_without_a_zygote_the_launcher_says_so_and_starts_the_script_itself(tmp_path, zygote):
    run = _launch(tmp_path, str(tmp_path / "none.sock"), "4")
    out, err = run.communicate(timeout=120)
    assert run.returncode == 4, err
    assert "no zygote at" in err and "as a plain process" in err
    assert json.loads(out.splitlines()[-1])["ppid"] != zygote[1]


@ray.remote
class _Where:
    def where(self) -> tuple[int, int]:
        return os.getpid(), os.getppid()


def test_ray_registers_and_kills_the_forked_worker(ray_local, zygote):
    """The launcher as the actor's ``py_executable`` (what the runtime-env hook gives every worker of a job)."""
    actor = _Where.options(runtime_env={"py_executable": launcher_command(zygote[0])}).remote()
    pid, parent = ray.get(actor.where.remote(), timeout=120)
    assert parent == zygote[1]
    ray.kill(actor)
    process = psutil.Process(pid)
    deadline = time.monotonic() + 30
    while process.is_running() and process.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not process.is_running() or process.status() == psutil.STATUS_ZOMBIE


@ray.remote
class _Env:
    def read(self) -> tuple[str | None, int, int]:
        return os.environ.get("ZYGOTE_SHIM_TEST"), os.getpid(), os.getppid()


def _shims(socket: str) -> list[psutil.Process]:
    """The worker shims of live workers whose runtime env names the zygote at ``socket``."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        words = process.info["cmdline"] or []
        if len(words) > 1 and words[1].endswith("setup_worker.py") and any(socket in word for word in words):
            found.append(process)
    return found


def test_the_shim_applies_the_env_like_rays_and_imports_no_ray(ray_local, zygote):
    """The session's clusters run `zygote_setup_worker.py` as their workers' shim (tests/conftest.py). A worker
    for the launcher gets the context's variables expanded as Ray's shim expands them (``${X}`` of an unset
    variable: empty), and its shim (the launcher) never loads Ray's core library; any other context goes to Ray's
    own shim, which still applies it."""
    from ray._private import ray_constants

    from nemo_rl_clone.distributed.worker_zygote import SETUP_WORKER

    if not ray_constants.SETUP_WORKER_FILENAME.endswith(SETUP_WORKER):
        pytest.skip("NRL_TEST_WORKER_ZYGOTE=0: the session's clusters use Ray's own worker shim")
    value = "${HOME}/x${NRL_SURELY_UNSET_VARIABLE}"
    forked = _Env.options(
        runtime_env={"py_executable": launcher_command(zygote[0]), "env_vars": {"ZYGOTE_SHIM_TEST": value}}
    ).remote()
    got, _, parent = ray.get(forked.read.remote(), timeout=120)
    assert got == os.path.expanduser("~") + "/x" and parent == zygote[1]
    (shim,) = _shims(zygote[0])
    assert shim.cmdline()[1].endswith(SETUP_WORKER)
    with open(f"/proc/{shim.pid}/maps") as maps:
        assert "_raylet" not in maps.read()  # Ray's shim imports ray, whose core library is _raylet.so

    plain = _Env.options(
        runtime_env={"py_executable": sys.executable, "env_vars": {"ZYGOTE_SHIM_TEST": value}}
    ).remote()
    got, _, parent = ray.get(plain.read.remote(), timeout=120)
    assert got == os.path.expanduser("~") + "/x" and parent != zygote[1]
    for actor in (forked, plain):
        ray.kill(actor)
