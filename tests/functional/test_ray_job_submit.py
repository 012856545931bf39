"""GRPO submitted to a running 2-node Ray cluster with ``ray job submit``, as on KubeRay or any managed Ray.

The module starts its own cluster on this machine: a head (``ray start --head``) and a worker node (``ray start
--address``), each with 1 CPU, its own ports and its own short ``--temp-dir``, so it neither collides with nor
attaches to any other Ray instance here (the address file of a ``ray start`` lives in its temp dir). Both run with
``--block`` as children of the test; stopping the cluster kills their process trees and whatever names its temp
dir, never a global ``ray stop`` (which would stop every Ray instance here). Every node and every ``ray`` command
uses the same token (``RAY_AUTH_MODE=token``).

The job is what a user types: ``ray job submit --working-dir <repo> -- uv run --no-sync examples/...``. Ray uploads
the repo without .git, .venv and what .gitignore lists (~2 MiB); ``uv run --no-sync`` runs in the existing
environment named by ``UV_PROJECT_ENVIRONMENT`` (set in the cluster's environment, as a container image sets it)
instead of building a fresh 4 GB .venv in the job's working dir; the uploaded sources come first on the job's
PYTHONPATH.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.functional.supervised_runs import REPO, plain_worker_processes, read_metrics

RAY = Path(sys.executable).with_name("ray")
NODE_CPUS = 1  # one worker slot per node: cluster.num_nodes=2 fits, 3 does not
JOB_TIMEOUT_S = 400


def _free_ports(count: int) -> list[int]:
    """Ports free right now (held open together, so they are distinct)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("", 0))
        return [sock.getsockname()[1] for sock in sockets]


def _free_port_range(size: int) -> tuple[int, int]:
    """A run of ``size`` consecutive free ports for a node's workers (Ray's default range is shared by every Ray
    instance on the machine)."""
    for _ in range(50):
        start = random.randrange(20000, 30000)
        with contextlib.ExitStack() as stack:
            try:
                for port in range(start, start + size):
                    stack.enter_context(socket.socket()).bind(("", port))
            except OSError:
                continue
        return start, start + size - 1
    raise RuntimeError(f"no {size} consecutive free ports found")


def _node_ports() -> list[str]:
    manager, objects, agent_http, agent_grpc, metrics, runtime_env = _free_ports(6)
    low, high = _free_port_range(40)
    return [
        f"--node-manager-port={manager}",
        f"--object-manager-port={objects}",
        f"--dashboard-agent-listen-port={agent_http}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--metrics-export-port={metrics}",
        f"--runtime-env-agent-port={runtime_env}",
        f"--min-worker-port={low}",
        f"--max-worker-port={high}",
    ]


@dataclass
class TwoNodeRayCluster:
    root: Path  # short: Ray's unix socket paths under it must stay below 108 characters
    gcs_port: int
    dashboard_port: int
    nodes: list[subprocess.Popen] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # of the nodes and of every `ray` command talking to them

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def start(self) -> None:
        # The nodes start their workers themselves: not through this test process's zygote (tests/conftest.py)
        env = plain_worker_processes({key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"})
        # What a container image sets: `uv run` uses this environment wherever the job's working dir is.
        env["UV_PROJECT_ENVIRONMENT"] = sys.prefix
        env["UV_NO_SYNC"] = "1"  # as docker/Dockerfile sets it: even a plain `uv run` never re-syncs this env
        env["PYTHONUNBUFFERED"] = "1"
        # Token auth, set the same on every node: with RAY_AUTH_MODE unset, Ray 2.60 turns it on for a head when
        # ~/.ray/auth_token exists but not for a joining worker node, which then fails with InvalidAuthToken.
        token = self.root / "auth_token"
        token.write_text(secrets.token_hex(32))
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
        self.env = env
        (client_port,) = _free_ports(1)
        head = [
            "--head",
            f"--port={self.gcs_port}",
            f"--dashboard-port={self.dashboard_port}",
            "--dashboard-host=127.0.0.1",
            "--include-dashboard=true",
            f"--ray-client-server-port={client_port}",
        ]
        self._start_node("head", head)
        self._start_node("worker", [f"--address=127.0.0.1:{self.gcs_port}"])
        self._wait_for_nodes(2, timeout_s=120)

    def ray(self, *args: str, timeout_s: float = 60) -> str:
        """Output of a ``ray`` CLI command against this cluster (asserts exit code 0)."""
        proc = subprocess.run([str(RAY), *args], env=self.env, capture_output=True, text=True, timeout=timeout_s)
        assert proc.returncode == 0, f"ray {' '.join(args)}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        return proc.stdout

    def job_info(self, job_id: str) -> dict:
        """The job's record from the dashboard's REST API (``ray job status`` prints it only as prose)."""
        request = urllib.request.Request(f"{self.dashboard}/api/jobs/{job_id}")
        request.add_header("Authorization", f"Bearer {Path(self.env['RAY_AUTH_TOKEN_PATH']).read_text()}")
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)

    def _start_node(self, name: str, args: list[str]) -> None:
        temp_dir = self.root / name
        temp_dir.mkdir()
        log = (self.root / f"{name}.log").open("w")
        command = [str(RAY), "start", "--block", f"--temp-dir={temp_dir}", f"--num-cpus={NODE_CPUS}", "--num-gpus=0"]
        command += ["--disable-usage-stats", *args, *_node_ports()]
        self.nodes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env))

    def _wait_for_nodes(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        alive: list = []
        while time.monotonic() < deadline:
            for node in self.nodes:
                assert node.poll() is None, f"`ray start` exited:\n{self._logs()}"
            with contextlib.suppress(AssertionError, json.JSONDecodeError):  # the dashboard is still starting
                nodes = json.loads(self.ray("list", "nodes", f"--address={self.dashboard}", "--format=json"))
                alive = [node for node in nodes if node["state"] == "ALIVE"]
                if len(alive) == count:
                    return
            time.sleep(1)
        raise AssertionError(f"{len(alive)} of {count} nodes alive after {timeout_s} s:\n{self._logs()}")

    def _logs(self) -> str:
        return "\n".join(path.read_text()[-3000:] for path in sorted(self.root.glob("*.log")))

    def stop(self) -> None:
        """Kill what the two ``ray start`` started (GCS, raylets, dashboard, workers, job drivers), found as their
        descendants or by this cluster's temp dir in the command line (processes re-parented when their parent
        died). Ray's own `ray stop` would stop every Ray instance on the machine."""
        doomed: dict[int, psutil.Process] = {}
        for node in self.nodes:
            with contextlib.suppress(psutil.NoSuchProcess):
                for process in psutil.Process(node.pid).children(recursive=True):
                    doomed[process.pid] = process
        for process in psutil.process_iter(["cmdline"]):
            if any(str(self.root) in part for part in process.info["cmdline"] or []):
                doomed[process.pid] = process
        starters = {node.pid for node in self.nodes}
        for process in doomed.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGTERM)
        # A few seconds for a clean exit; the cluster is thrown away, so the rest is killed.
        alive = _wait_until_gone([p for pid, p in doomed.items() if pid not in starters], timeout_s=5)
        for process in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        assert not _wait_until_gone(alive, timeout_s=15), alive
        for node in self.nodes:  # `ray start --block` keeps waiting after a SIGTERM; it only watches the others
            node.kill()
            node.wait(timeout=15)


def _wait_until_gone(processes: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """The processes still running after ``timeout_s``. Zombies count as gone: once their parent (a raylet) is dead,
    reaping them is up to whoever inherits them, and they hold nothing."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                if process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


@pytest.fixture(scope="module")
def two_node_ray() -> Iterator[TwoNodeRayCluster]:
    root = Path(tempfile.mkdtemp(prefix="nrlj", dir="/tmp"))
    gcs_port, dashboard_port = _free_ports(2)
    cluster = TwoNodeRayCluster(root, gcs_port, dashboard_port)
    try:
        start = time.monotonic()
        cluster.start()
        print(f"\n2-node Ray cluster up in {time.monotonic() - start:.1f} s")
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class SubmittedJob:
    status: str
    logs: str
    seconds: float  # from `ray job submit` to the end of the job
    first_step_s: float | None  # from `ray job submit` to the first "step 1: saved checkpoint" line


def submit(cluster: TwoNodeRayCluster, tmp_path: Path, *overrides: str) -> SubmittedJob:
    """``ray job submit`` (which waits for the job and streams its output), then the job's status and ``ray job logs``;
    a job still running after `JOB_TIMEOUT_S` is stopped."""
    job_id = f"nrl-test-{os.getpid()}-{time.monotonic_ns()}"
    command = [
        str(RAY),
        "job",
        "submit",
        f"--address={cluster.dashboard}",
        f"--submission-id={job_id}",
        f"--working-dir={REPO}",
        "--",
        "uv",
        "run",
        "--no-sync",
        "examples/run_grpo_math.py",
        "--config",
        "configs/grpo_smoke.yaml",
        f"logger.log_dir={tmp_path / 'logs'}",  # absolute: outside the job's uploaded working dir
        f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        *overrides,
    ]
    start = time.monotonic()
    first_step_s = None
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=cluster.env
    )
    watchdog = threading.Timer(JOB_TIMEOUT_S, proc.kill)  # a silent, hanging job must not block the read below
    watchdog.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if first_step_s is None and "step 1: saved checkpoint" in line:
                first_step_s = time.monotonic() - start
        proc.wait()
    finally:
        watchdog.cancel()
    seconds = time.monotonic() - start
    address = f"--address={cluster.dashboard}"
    status = cluster.job_info(job_id)["status"]
    if status not in ("SUCCEEDED", "FAILED", "STOPPED"):
        cluster.ray("job", "stop", address, job_id)
    return SubmittedJob(status, cluster.ray("job", "logs", address, job_id), seconds, first_step_s)


@pytest.mark.slow
def test_cluster_shape_mismatch_fails_the_job_with_one_line(two_node_ray, tmp_path):
    # 4 nodes, not 3: 3 workers would also make train_global_batch_size=8 indivisible, a second error line.
    job = submit(two_node_ray, tmp_path, "cluster.num_nodes=4")
    print(f"\nmismatch: job {job.status} {job.seconds:.1f} s after `ray job submit`")
    assert job.status == "FAILED", job.logs[-3000:]
    errors = [line for line in job.logs.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, job.logs[-3000:]
    assert errors[0].startswith("error: cluster.num_nodes=4, cluster.gpus_per_node=1: the Ray cluster at ")
    assert errors[0].endswith(
        "has room for 2 such node(s), not 4 (on CPU a worker slot takes 1 CPU; its alive nodes: 2 x (CPU 1, GPU 0))"
    )
    assert not (tmp_path / "logs").exists() and not (tmp_path / "ckpt").exists()  # failed before creating anything


@pytest.mark.slow
def test_grpo_job_on_two_nodes(two_node_ray, tmp_path):
    job = submit(two_node_ray, tmp_path, "cluster.num_nodes=2", "grpo.max_num_steps=2")
    print(f"\ngrpo job: {job.status}, first step {job.first_step_s} s, done {job.seconds:.1f} s after `ray job submit`")
    assert job.status == "SUCCEEDED", job.logs[-5000:]
    lines = job.logs.splitlines()
    for step in (1, 2):
        assert any(f"step {step}: saved checkpoint" in line for line in lines), job.logs[-5000:]
    assert any(line.startswith("Done after step 2.") for line in lines)
    (run_dir,) = (tmp_path / "logs").iterdir()
    metrics = read_metrics(run_dir)
    assert {"train/loss", "train/reward"} <= set(metrics[2])
    assert "validation/accuracy" in metrics[2]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_1", "step_2"]
    # The job ran in an uploaded working dir (one per content hash), in the cluster's environment: no .venv there.
    packages = two_node_ray.root.glob("head/session_latest/runtime_resources/working_dir_files/_ray_pkg_*")
    working_dirs = [path for path in packages if path.is_dir()]
    assert working_dirs and all((d / "examples" / "run_grpo_math.py").is_file() for d in working_dirs)
    assert not any((d / ".venv").exists() for d in working_dirs)
    # One policy worker per node: Ray names each actor at the top of its worker's log file on that node.
    for node in ("head", "worker"):
        logs = two_node_ray.root.glob(f"{node}/session_*/logs/worker-*.out")
        assert any(":actor_name:DTensorPolicyWorker" in path.read_text(errors="replace") for path in logs), node
