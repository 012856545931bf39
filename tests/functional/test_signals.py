"""Ctrl-C, SIGTERM and SIGKILL of real runs (`configs/grpo_smoke.yaml`, `configs/grpo_agent_smoke.yaml`,
`configs/sft_smoke.yaml`).

Each run is started in a session of its own, so that everything it starts can be found afterwards by that session
id (Ray's workers make process groups of their own, but stay in the session) and by the process tree recorded while
it runs. The tests synchronise with a run through its output lines (`step 2: generation`, the save-pause marker of
`run.state.SAVE_PAUSE_ENV`). The time bounds are the behaviour promised in
docs/logging_and_checkpoints.md, stated generously.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from nemo_rl_clone.algorithms.run.state import SAVE_PAUSE_ENV
from tests.functional.supervised_runs import REPO, assert_checkpoint

# Beside other tests: a /dev/shm entry counts as left behind only when no live process holds it (`held_shm`), so
# another test's segments in use do not count; the exit bounds (10 s for Ctrl-C) are 4x what a run took beside a
# busy neighbour (2.5 s).

CTRL_C_BOUND_S = 10.0
SIGTERM_BOUND_S = 60.0  # the default checkpointing.sigterm_grace_period_s
SAVE_PAUSED = "checkpoint save paused"


class Run:
    """``examples/run_{algorithm}.py`` in a new session, its output collected line by line."""

    def __init__(self, algorithm: str, workdir: Path, *overrides: str, config: str, save_pause_s: float = 0) -> None:
        # The run's TMPDIR, short: Ray puts its unix sockets there when the log dir is too long for them.
        self.workdir, self.tmp = workdir, Path(tempfile.mkdtemp(prefix="nrl-sig-", dir="/tmp"))
        self.shm_before = set(os.listdir("/dev/shm"))
        # torch's compile cache lives across runs by design: keep it out of the run's TMPDIR.
        cache = {"TORCHINDUCTOR_CACHE_DIR": str(workdir / "inductor_cache")}
        env = {**os.environ, **cache, "TMPDIR": str(self.tmp)}
        if save_pause_s:
            env[SAVE_PAUSE_ENV] = str(save_pause_s)
        args = [
            sys.executable,
            str(REPO / "examples" / f"run_{algorithm}.py"),
            "--config",
            str(REPO / "configs" / config),
            f"logger.log_dir={workdir / 'logs'}",
            f"checkpointing.checkpoint_dir={workdir / 'ckpt'}",
            *overrides,
        ]
        self.proc = subprocess.Popen(
            args,
            cwd=workdir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.session = self.proc.pid
        self.lines: list[str] = []
        self.tree: dict[int, float] = {}
        self._seen = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._seen:
                self.lines.append(line)
                self._seen.notify_all()
        with self._seen:  # EOF: the run ended, wake a waiter
            self._seen.notify_all()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, timeout: float = 480) -> None:
        with self._seen:
            ok = self._seen.wait_for(
                lambda: any(text in line for line in self.lines) or self.proc.poll() is not None, timeout=timeout
            )
        assert ok and any(text in line for line in self.lines), f"no {text!r} in time:\n{self.output[-4000:]}"
        self._record_tree()

    def _record_tree(self) -> None:
        for proc in psutil.Process(self.proc.pid).children(recursive=True):
            self.tree.setdefault(proc.pid, proc.create_time())

    def send(self, sig: int, group: bool = False) -> float:
        """Send ``sig`` to the driver (or its process group, as a terminal's Ctrl-C does); returns the send time."""
        self._record_tree()
        (os.killpg if group else os.kill)(self.proc.pid, sig)
        return time.monotonic()

    def wait_exit(self, sent: float, bound: float) -> tuple[int, float]:
        code = self.proc.wait(timeout=bound + 60)
        took = time.monotonic() - sent
        print(f"exit {code} after {took:.1f} s")
        return code, took

    def assert_nothing_left(self, within_s: float = 15) -> None:
        """No process of the session or of the recorded tree, no new /dev/shm entry, nothing in the run's TMPDIR."""
        deadline = time.monotonic() + within_s
        while True:
            alive = [p for p in psutil.process_iter(["pid", "create_time", "cmdline"]) if self._ours(p)]
            shm = set(os.listdir("/dev/shm")) - self.shm_before
            shm -= held_shm() if shm else set()  # only when needed: reading every process's maps takes a while
            shm -= foreign_semaphores(shm)
            tmp = self._files_left()
            if not (alive or shm or tmp) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert not alive, [(p.pid, " ".join(p.info["cmdline"] or [])[:120]) for p in alive]
        assert not shm, shm
        assert not tmp, tmp
        shutil.rmtree(self.tmp)

    def _files_left(self) -> list[str]:
        """Files under the run's TMPDIR (Ray's root folder may stay). A folder that vanishes during the walk is being
        cleaned up right now: count it as still there, and look again."""
        try:
            return [str(p) for p in self.tmp.rglob("*") if not p.is_dir() or p.is_symlink()]
        except FileNotFoundError as gone:
            return [f"{gone.filename} (removed while listed)"]

    def _ours(self, proc: psutil.Process) -> bool:
        try:
            return os.getsid(proc.pid) == self.session or self.tree.get(proc.pid) == proc.info["create_time"]
        except OSError:
            return False


def foreign_semaphores(entries: set[str]) -> set[str]:
    """Python multiprocessing's named locks (``sem.mp-*``, 32 bytes, random names) among ``entries`` that may be
    another test's: beside another xdist worker, a test elsewhere whose process was killed leaves them, and they
    cannot be told from this run's. Alone, every entry counts."""
    beside_others = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1
    return {entry for entry in entries if entry.startswith("sem.mp-")} if beside_others else set()


def held_shm() -> set[str]:
    """Names of the /dev/shm entries some live process has mapped or open (any process: another test's too)."""
    held = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as maps:
            held.update(line.split("/dev/shm/", 1)[1].split()[0] for line in maps if "/dev/shm/" in line)
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("/dev/shm/"):
                        held.add(target.removeprefix("/dev/shm/").split()[0])
    return held


def checkpoints(workdir: Path) -> list[str]:
    return sorted(p.name for p in (workdir / "ckpt").iterdir()) if (workdir / "ckpt").exists() else []


GRPO = ("grpo_math", "grpo_smoke.yaml")


def test_grpo_sigterm_in_generation_then_in_save_then_ctrl_c_in_save(tmp_path):
    """Three runs of one checkpoint folder, each resuming from what the one before left (Ctrl-C to the whole process
    group during generation: the agent run below):

    1. SIGTERM while step 2 generates: step 1 (not saved by the period) is saved, exit 143.
    2. SIGTERM while step 2 saves: the save completes and the run stops before step 3 (exit 143, nothing more to save).
    3. Ctrl-C to the driver alone while step 3 saves: it stops at once (exit 130), the half-written step is gone."""
    run = Run(*GRPO[:1], tmp_path, "grpo.max_num_steps=4", "checkpointing.save_period=10", config=GRPO[1])
    run.wait_for("step 2: generation")
    code, took = run.wait_exit(run.send(signal.SIGTERM), SIGTERM_BOUND_S)
    assert code == 143 and took < SIGTERM_BOUND_S, run.output[-3000:]
    assert "saved step 1" in run.output and "Resume: uv run" in run.output, run.output[-3000:]
    run.assert_nothing_left()
    assert checkpoints(tmp_path) == ["step_1"]
    assert_checkpoint(tmp_path / "ckpt" / "step_1")

    run = Run(*GRPO[:1], tmp_path, "grpo.max_num_steps=4", config=GRPO[1], save_pause_s=3)
    run.wait_for(SAVE_PAUSED)
    assert "step_1 (step 1)" in run.output  # resumed from the checkpoint SIGTERM wrote
    code, took = run.wait_exit(run.send(signal.SIGTERM), SIGTERM_BOUND_S)
    assert code == 143 and took < SIGTERM_BOUND_S, run.output[-3000:]
    assert "nothing new to save" in run.output, run.output[-3000:]
    run.assert_nothing_left()
    assert checkpoints(tmp_path) == ["step_1", "step_2"]
    assert_checkpoint(tmp_path / "ckpt" / "step_2")

    run = Run(*GRPO[:1], tmp_path, "grpo.max_num_steps=4", config=GRPO[1], save_pause_s=60)
    run.wait_for(SAVE_PAUSED)
    assert "step_2 (step 2)" in run.output
    code, took = run.wait_exit(run.send(signal.SIGINT), CTRL_C_BOUND_S)
    assert code == 130 and took < CTRL_C_BOUND_S, run.output[-3000:]
    assert "Stopped by Ctrl-C" in run.output and "last complete checkpoint:" in run.output, run.output[-3000:]
    run.assert_nothing_left()
    assert checkpoints(tmp_path) == ["step_1", "step_2"]  # the half-written tmp_step_3 is gone


# Two bundles (a CPU each) shared by two policy workers and one engine of two tensor-parallel ranks: the engine's
# rank processes must go too.
TP2_ENGINE = ("cluster.gpus_per_node=2", "policy.generation.vllm_cfg.tensor_parallel_size=2")


def test_grpo_sigkill_of_the_driver_leaves_nothing(tmp_path):
    run = Run(*GRPO[:1], tmp_path, "grpo.max_num_steps=3", *TP2_ENGINE, config=GRPO[1])
    run.wait_for("step 1: generation")
    run.send(signal.SIGKILL)
    run.proc.wait(timeout=30)
    run.assert_nothing_left(within_s=10)


def test_grpo_ctrl_c_with_agent_requests_in_flight_leaves_nothing(tmp_path):
    """An agent run (`configs/grpo_agent_smoke.yaml`) whose episodes always have a long completion in flight on the
    engine's HTTP server through the router: Ctrl-C to the process group stops it within the bound, and no engine
    core, router, agent actor, /dev/shm segment or temp file is left (the async engine of two ranks stops cleanly in
    tests/unit/test_vllm_engine_parallel.py)."""
    agent = f"env.agent.function={REPO / 'tests' / 'functional' / 'looping_agent.py'}:run"
    run = Run(*GRPO[:1], tmp_path, agent, config="grpo_agent_smoke.yaml")
    run.wait_for("agent: request in flight")
    code, took = run.wait_exit(run.send(signal.SIGINT, group=True), CTRL_C_BOUND_S)
    assert code == 130 and took < CTRL_C_BOUND_S, run.output[-3000:]
    assert "Stopped by Ctrl-C" in run.output, run.output[-3000:]
    run.assert_nothing_left()


def test_sft_sigterm_saves_the_last_step_and_resumes(tmp_path):
    """SFT steps take about a second here, so the boundary where SIGTERM stops the run is read from its line."""
    overrides = ("sft.max_num_steps=8", "checkpointing.save_period=10", "sft.val_period=0")
    run = Run("sft", tmp_path, *overrides, config="sft_smoke.yaml")
    run.wait_for("step 3: training")
    code, took = run.wait_exit(run.send(signal.SIGTERM), SIGTERM_BOUND_S)
    assert code == 143 and took < SIGTERM_BOUND_S, run.output[-3000:]
    stopped = re.search(r"SIGTERM before step (\d+): \w+\): saved step (\d+);", run.output)
    assert stopped, run.output[-3000:]
    saved = int(stopped.group(2))
    assert saved == int(stopped.group(1)) - 1 >= 2  # the last completed step
    run.assert_nothing_left()
    assert checkpoints(tmp_path) == [f"step_{saved}"]
    assert_checkpoint(tmp_path / "ckpt" / f"step_{saved}")

    run = Run("sft", tmp_path, *overrides, config="sft_smoke.yaml")
    assert run.proc.wait(timeout=300) == 0, run.output[-3000:]
    assert f"step_{saved} (step {saved})" in run.output
    run.assert_nothing_left()
    assert checkpoints(tmp_path) == sorted([f"step_{saved}", "step_8"])


if __name__ == "__main__":
    pytest.main([__file__, "-x", "-q", "-s"])
