"""`ray.sub` under a real Slurm (22.05, Debian packages): a 2-node cluster on this machine from
`tools/local_slurm.py`, each node 1 CPU, jobs submitted with ``sbatch`` exactly as users do.

The module fixture starts that cluster unless one already runs from ``tools/local_slurm.py``'s default dir, and stops
only what it started. No Slurm installed and none installable (apt) is a test failure, not a skip: CI installs it.

A job's processes are found afterwards by ``SLURM_JOB_ID`` in their environment (Slurm sets it in every step, and
Ray's raylets pass it on to every worker) and by the job's Ray temp dirs (``/tmp/ray-sub-<job>-<node rank>``).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from tests.functional.supervised_runs import REPO, assert_checkpoint, plain_worker_processes
from tests.scripts import load_script

# On the worker of the other "system" tests, one at a time (tests/machine_share.py): installs Slurm and munge, starts their daemons.
pytestmark = pytest.mark.xdist_group("system")

RAY_SUB = REPO / "ray.sub"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}
GRPO = "uv run --no-sync examples/run_grpo_math.py --config configs/grpo_smoke.yaml"


def _load_local_slurm():  # tools/ is not a package
    return load_script(REPO / "tools" / "local_slurm.py", register=True)


local_slurm = _load_local_slurm()


@pytest.fixture(scope="module")
def slurm_env() -> Iterator[dict[str, str]]:
    """The environment for sbatch & co (``SLURM_CONF``) of a running 2-node local cluster."""
    directory = local_slurm.DEFAULT_DIR
    state = local_slurm.running(directory)
    started = state is None
    if state is None:
        try:
            state = local_slurm.start(directory, nodes=2, cpus=1, mem_mb=8000, base_port=16817, timeout_s=90)
        except (local_slurm.SlurmError, OSError, subprocess.SubprocessError) as error:
            pytest.fail(f"cannot start a local Slurm cluster (tools/local_slurm.py): {error}")
    assert len(state.nodes) == 2, f"the local Slurm cluster of {directory} has nodes {state.nodes}, want 2"
    # Slurm's nodes start their own Ray workers: not through this test process's zygote (tests/conftest.py)
    env = plain_worker_processes({**os.environ, "SLURM_CONF": state.conf, "PYTHONUNBUFFERED": "1"})
    jobs_before = set(_squeue(env))
    yield env
    for job in set(_squeue(env)) - jobs_before:  # whatever a failed test left running
        subprocess.run(["scancel", job], env=env, check=False)
    if started:
        local_slurm.stop(directory)


def _squeue(env: dict[str, str]) -> list[str]:
    proc = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True, check=False)
    return proc.stdout.split()


@dataclass
class Job:
    id: str
    workdir: Path
    env: dict[str, str]

    @property
    def log_dir(self) -> Path:
        return self.workdir / "ray-logs" / self.id

    def read(self, name: str) -> str:
        path = self.workdir / name if name.startswith("slurm-") else self.log_dir / name
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self) -> str:
        """The job's stdout and every log of its log dir (tails), for failure messages."""
        parts = [f"--- slurm-{self.id}.out ---\n{self.read(f'slurm-{self.id}.out')[-3000:]}"]
        if self.log_dir.exists():
            parts += [
                f"--- {p.name} ---\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.log_dir.glob("*.log"))
            ]
        return "\n".join(parts)

    def info(self) -> dict[str, str]:
        proc = subprocess.run(
            ["scontrol", "-o", "show", "job", self.id], env=self.env, capture_output=True, text=True, check=False
        )
        return dict(re.findall(r"(\w+)=(\S*)", proc.stdout))

    def wait_for(self, name: str, text: str, timeout_s: float) -> float:
        """Seconds until ``text`` shows in log ``name``; fails (with the logs) if the job ends first."""
        start = time.monotonic()
        while text not in self.read(name):
            state = self.info().get("JobState", "")
            assert state not in TERMINAL and time.monotonic() - start < timeout_s, (
                f"no {text!r} in {name} (job {state}, {time.monotonic() - start:.0f} s):\n{self.logs()}"
            )
            time.sleep(1)
        return time.monotonic() - start

    def wait_done(self, timeout_s: float = 300) -> dict[str, str]:
        deadline = time.monotonic() + timeout_s
        while (info := self.info()).get("JobState") not in TERMINAL:
            assert time.monotonic() < deadline, f"job {self.id} still {info.get('JobState')}:\n{self.logs()}"
            time.sleep(1)
        return info

    def assert_nothing_left(self, within_s: float = 30) -> None:
        """No process of the job (by SLURM_JOB_ID or its Ray temp dirs) and no Ray temp dir of it."""
        deadline = time.monotonic() + within_s
        while (left := self._processes()) and time.monotonic() < deadline:
            time.sleep(1)
        assert not left, f"processes of job {self.id} left: {left}\n{self.logs()}"
        temp_dirs = list(Path("/tmp").glob(f"ray-sub-{self.id}-*"))
        assert not temp_dirs, temp_dirs

    def _processes(self) -> list[str]:
        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                environ = proc.environ()
            except (psutil.Error, OSError):
                continue
            # SLURM_CONF too: job ids of another Slurm on this machine may repeat ours.
            ours = environ.get("SLURM_JOB_ID") == self.id and environ.get("SLURM_CONF") == self.env["SLURM_CONF"]
            cmdline = " ".join(proc.info["cmdline"] or [])
            if ours or f"/ray-sub-{self.id}-" in cmdline:
                found.append(f"{proc.pid} {cmdline[:150]}")
        return found


def submit(env: dict[str, str], workdir: Path, *sbatch_args: str, command: str | None, **extra: str) -> Job:
    """sbatch ray.sub from ``workdir`` (not the repository: ray.sub must find it itself)."""
    job_env = {**env, **extra}
    job_env.pop("COMMAND", None)
    if command is not None:
        job_env["COMMAND"] = command
    proc = subprocess.run(
        ["sbatch", "--parsable", *sbatch_args, str(RAY_SUB)], env=job_env, cwd=workdir, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return Job(proc.stdout.strip().split(";")[0], workdir, env)


def grpo_command(workdir: Path, *overrides: str) -> str:
    return " ".join(
        [
            GRPO,
            f"logger.log_dir={workdir / 'logs'}",
            f"checkpointing.checkpoint_dir={workdir / 'ckpt'}",
            "cluster.num_nodes=1",
            *overrides,
        ]
    )


def test_grpo_smoke_run_and_a_sigterm_save(slurm_env, tmp_path):
    """Two GRPO smoke jobs at once, one per node (half the wall time of one after the other):

    - a full run: exit code 0, the head's start, the steps and checkpoints in the logs, nothing left; prints the time
      from sbatch to its first step's line;
    - a run stopped by `scancel --batch --signal=TERM` after step 1: ray.sub forwards SIGTERM to COMMAND only, whose
      Ray workers are still up, so it saves the last completed step (1, or 2 if that completes before the next phase
      boundary; the save period would save none) and exits 143; then Ray is torn down.

    Job states are polled every second (`sbatch --wait` polls with a growing interval, up to ~30 s late; it is used
    in `test_failing_command`)."""
    full_dir, stopped_dir = tmp_path / "full", tmp_path / "stopped"
    full_dir.mkdir()
    stopped_dir.mkdir()
    full = submit(slurm_env, full_dir, "--nodes=1", command=grpo_command(full_dir))
    stopped = submit(
        slurm_env,
        stopped_dir,
        "--nodes=1",
        command=grpo_command(stopped_dir, "grpo.max_num_steps=3", "checkpointing.save_period=10"),
    )

    stopped.wait_for("command.log", "step 2: generation", timeout_s=400)
    subprocess.run(["scancel", "--batch", "--signal=TERM", stopped.id], env=slurm_env, check=True)
    info = stopped.wait_done(timeout_s=240)
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "143:0"), stopped.logs()
    saved = re.search(r"Stopped by SIGTERM \(.*\): saved step (\d+);", stopped.read("command.log"))
    assert saved and saved.group(1) in ("1", "2"), stopped.logs()
    assert saved.group(0) in stopped.read(f"slurm-{stopped.id}.out"), stopped.logs()  # the verdict on the job's stderr
    assert "forwarding to COMMAND" in stopped.read(f"slurm-{stopped.id}.out"), stopped.logs()
    assert sorted(p.name for p in (stopped_dir / "ckpt").iterdir()) == [f"step_{saved.group(1)}"]
    assert_checkpoint(stopped_dir / "ckpt" / f"step_{saved.group(1)}")
    stopped.assert_nothing_left()

    info = full.wait_done(timeout_s=400)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), full.logs()
    out = full.read(f"slurm-{full.id}.out")
    assert f"logs in {full.log_dir}" in out.splitlines()[0], out
    assert "Ray runtime started" in full.read("ray-head.log"), full.logs()
    assert "step 2: training" in full.read("command.log"), full.logs()
    assert_checkpoint(full_dir / "ckpt" / "step_2")
    full.assert_nothing_left()
    line = next(line for line in full.read("command.log").splitlines() if "step 1: generation" in line)
    start = datetime.strptime(info["SubmitTime"], "%Y-%m-%dT%H:%M:%S")
    at = re.match(r"\[(\d\d:\d\d:\d\d)\]", line)
    if at:  # the step line's own clock time, against Slurm's submit time
        first = datetime.combine(start.date(), datetime.strptime(at.group(1), "%H:%M:%S").time())
        print(f"sbatch -> 'step 1: generation' of the full run: {(first - start).total_seconds():.0f} s")


@pytest.mark.parametrize(("nodes", "in_step"), [(2, "0"), (1, "1")], ids=["two_nodes", "command_in_step"])
def test_failing_command(slurm_env, tmp_path, nodes, in_step):
    """COMMAND sees every node (RAY_ADDRESS set, the venv's python first on PATH) and exits 7: sbatch --wait returns
    7 and the job is FAILED with exit code 7. COMMAND runs in the batch shell, or (``COMMAND_IN_STEP=1``, the
    container path minus the container) in an srun step of its own."""
    command = "python -c 'import ray; ray.init(); print(\"NODES\", len(ray.nodes()))'; exit 7"
    if in_step == "0":  # as users do: sbatch --wait returns the job's exit code
        proc = subprocess.run(
            ["sbatch", "--wait", "--parsable", f"--nodes={nodes}", str(RAY_SUB)],
            env={**slurm_env, "COMMAND": command},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        job = Job(proc.stdout.strip(), tmp_path, slurm_env)
        assert proc.returncode == 7, job.logs()
    else:
        job = submit(slurm_env, tmp_path, f"--nodes={nodes}", command=command, COMMAND_IN_STEP="1")
        job.wait_done()
    assert f"NODES {nodes}" in job.read("command.log"), job.logs()
    assert f"all {nodes} nodes joined" in job.read(f"slurm-{job.id}.out"), job.logs()
    worker_logs = list(job.log_dir.glob("ray-worker-*.log"))
    assert len(worker_logs) == nodes - 1, job.logs()
    assert all("Ray runtime started" in log.read_text() for log in worker_logs), job.logs()
    info = job.info()
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "7:0"), info
    job.assert_nothing_left()


def test_a_node_that_cannot_join_fails_the_job_naming_it(slurm_env, tmp_path):
    """A fixed node-manager port on two Slurm nodes of one host: the worker cannot start, and after NODE_WAIT_S the
    job fails with one line naming the node, before COMMAND runs."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        port = str(sock.getsockname()[1])
    job = submit(slurm_env, tmp_path, "--nodes=2", command="echo COMMAND RAN", NODE_MANAGER_PORT=port, NODE_WAIT_S="20")
    info = job.wait_done(timeout_s=240)
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "1:0"), job.logs()
    errors = [line for line in job.read(f"slurm-{job.id}.out").splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "1 of 2 nodes missing" in errors[0] and "not joined" in errors[0], job.logs()
    assert "COMMAND RAN" not in job.read("command.log")
    job.assert_nothing_left()


def test_interactive_attach_then_plain_scancel(slurm_env, tmp_path):
    """No COMMAND: the 2-node cluster stays up and <log dir>/attach.sh runs a command on the head against it. Then a
    plain `scancel` while a driver with an actor runs (attached step) leaves no process behind."""
    job = submit(slurm_env, tmp_path, "--nodes=2", command=None)
    job.wait_for(f"slurm-{job.id}.out", "attach with", timeout_s=240)
    attach = job.log_dir / "attach.sh"
    probe = "import ray; ray.init(); print('CLUSTER', ray.cluster_resources()['CPU'], len(ray.nodes()))"
    proc = subprocess.run(
        [str(attach), "python", "-c", probe], env=slurm_env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr + job.logs()
    assert "CLUSTER 2.0 2" in proc.stdout, proc.stdout + proc.stderr
    # A driver holding an actor on the cluster (in an attached step), then a plain scancel of the job.
    actor = "import ray, time; ray.init(); a = ray.remote(num_cpus=1)(type('A', (), {'f': lambda s: 1})).remote(); "
    actor += "ray.get(a.f.remote()); print('ACTOR UP', flush=True); time.sleep(600)"
    driver = subprocess.Popen(
        [str(attach), "python", "-c", actor], env=slurm_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert driver.stdout is not None
    deadline = time.monotonic() + 120
    lines: list[str] = []
    while not any("ACTOR UP" in line for line in lines) and time.monotonic() < deadline:
        lines.append(driver.stdout.readline())
        assert lines[-1] or driver.poll() is None, "".join(lines)
    assert any("ACTOR UP" in line for line in lines), "".join(lines)
    subprocess.run(["scancel", job.id], env=slurm_env, check=True)
    info = job.wait_done(timeout_s=120)
    driver.wait(timeout=60)
    assert info["JobState"] == "CANCELLED", info
    job.assert_nothing_left()
