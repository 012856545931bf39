"""Helpers of the functional tests: run an entry point as a real process, read its metrics, write small data files
in the real formats."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]


def entry_point_args(algorithm: str, workdir: Path, *overrides: str, config: str | None = None) -> list[str]:
    """The command line of ``examples/run_{algorithm}.py --config configs/{config or algorithm_smoke.yaml}`` with logs
    and checkpoints in ``workdir``."""
    return [
        sys.executable,
        str(REPO / "examples" / f"run_{algorithm}.py"),
        "--config",
        str(REPO / "configs" / (config or f"{algorithm}_smoke.yaml")),
        f"logger.log_dir={workdir / 'logs'}",
        f"checkpointing.checkpoint_dir={workdir / 'ckpt'}",
        *overrides,
    ]


def shared_ray_env() -> dict[str, str]:
    """This process's environment with ``RAY_ADDRESS`` set to this test worker's own local Ray cluster (started on
    first use, as `ray_local` does, and shut down at exit), so that a run attaches to it as to a ``ray start``
    cluster instead of starting and stopping Ray itself: the GRPO smoke run takes 24 s instead of 33 s (6 CPU-seconds
    less). An address already in the environment (a test's own cluster) is kept.

    Only for runs that go to their end: an attached run's actors are children of the shared raylet, not of the run, so
    a test that finds or kills a run's processes, or is about Ray's own start, runs with a cluster of its own."""
    if "RAY_ADDRESS" in os.environ:
        return dict(os.environ)
    import ray

    from nemo_rl_clone.distributed.virtual_cluster import init_ray
    from tests.conftest import RAY_TEST_NUM_CPUS

    init_ray(num_cpus=RAY_TEST_NUM_CPUS)
    return {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}


_forkserver: Any = None


def _script_in_child(script: str, argv: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """In a child forked from the zygote: ``python script argv...`` as far as the script can tell (its folder first
    on ``sys.path``, ``__main__``, the environment, the working folder, stdout and stderr as files), and the exit
    code a process would have."""
    import atexit
    import runpy
    import traceback

    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
    sys.argv = [script, *argv]
    # As Python starts a script: its folder, then PYTHONPATH's entries, before the rest.
    extra = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry and entry not in sys.path]
    sys.path[:0] = [os.path.dirname(script), *extra]
    code: Any = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        code = stop.code
    except BaseException:
        traceback.print_exc()
        code = 1
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()  # Ray's disconnect, as at a process's normal exit
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def run_script(args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``subprocess.run(args, capture_output=True, text=True)`` for ``[sys.executable, script.py, *argv]``, forked
    from a zygote process of this test worker that has the entry points' imports done (multiprocessing's forkserver,
    started on first use): a run to its end is still a process of its own — its own exit code, environment, working
    folder and streams, its own Ray driver — without paying ~4 CPU-seconds of imports each time. Runs that a test
    signals or kills stay plain processes (`LiveRun`)."""
    global _forkserver
    assert args[0] == sys.executable and args[1].endswith(".py"), args
    if _forkserver is None:
        import multiprocessing

        _forkserver = multiprocessing.get_context("forkserver")  # its imports: FORKSERVER_PRELOAD, tests/conftest.py
    with tempfile.TemporaryDirectory() as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        child = _forkserver.Process(target=_script_in_child, args=(args[1], args[2:], str(cwd), env, out, err))
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(args, timeout, Path(out).read_text(), Path(err).read_text())
        # -N when a signal N killed it, as subprocess says
        return subprocess.CompletedProcess(args, child.exitcode, Path(out).read_text(), Path(err).read_text())


def run_entry_point(
    algorithm: str,
    workdir: Path,
    *overrides: str,
    timeout: int = 600,
    config: str | None = None,
    plain_workers: bool = False,
) -> subprocess.CompletedProcess:
    """Run `entry_point_args` to the end (`run_script`), attached to the test worker's Ray cluster
    (`shared_ray_env`); asserts exit code 0. ``plain_workers``: its Ray workers are not forked from the zygote (a
    test that reads their peak memory: a fork's counts the zygote's imports)."""
    args = entry_point_args(algorithm, workdir, *overrides, config=config)
    env = plain_worker_processes(shared_ray_env()) if plain_workers else shared_ray_env()
    proc = run_script(args, workdir, env, timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def plain_worker_processes(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a run whose Ray workers must be its own descendants (a test searches its process tree, signals or
    kills them): not forked from the test worker's zygote (`_ray_worker_zygote` in tests/conftest.py)."""
    from nemo_rl_clone.distributed.worker_zygote import HOOK, SOCKET_ENV

    env = dict(env)
    env.pop(SOCKET_ENV, None)
    if env.get("RAY_RUNTIME_ENV_HOOK") == HOOK:
        del env["RAY_RUNTIME_ENV_HOOK"]
    return env


class LiveRun:
    """A run started in its own process group, its stdout and stderr read line by line as they come, so a test can
    act on a line the run printed (a handshake) and then kill the run with everything it started. ``lines`` holds
    both streams as they arrived; ``err_lines`` stderr's alone (where fault verdicts go)."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            args,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env=plain_worker_processes({**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}),
        )
        self.lines: list[str] = []
        self.err_lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._open_streams = 2
        threading.Thread(target=self._read, args=(self.proc.stdout, None), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, self.err_lines), daemon=True).start()

    def _read(self, stream: Any, also: list[str] | None) -> None:
        for line in stream:
            if also is not None:
                also.append(line)
            self._queue.put(line)
        self._queue.put(None)

    def _next(self, timeout_s: float) -> str | None:
        """The next line of either stream; None once both have ended."""
        while self._open_streams:
            line = self._queue.get(timeout=timeout_s)
            if line is not None:
                return line
            self._open_streams -= 1
        return None

    def wait_for_line(self, starts_with: str, timeout_s: float) -> str:
        """The first line starting with ``starts_with``; fails if the run ends or ``timeout_s`` passes first."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._next(timeout_s=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no line {starts_with!r} within {timeout_s} s:\n{''.join(self.lines[-40:])}"
                ) from None
            if line is None:
                raise AssertionError(f"the run ended before printing {starts_with!r}:\n{''.join(self.lines[-40:])}")
            self.lines.append(line)
            if line.startswith(starts_with):
                return line

    def wait_for_exit(self, timeout_s: float) -> int:
        """Wait for the run to exit; its remaining output goes to ``lines``. Returns the exit code."""
        code = self.proc.wait(timeout=timeout_s)
        while (line := self._next(timeout_s=30)) is not None:
            self.lines.append(line)
        return code

    def kill(self) -> None:
        """SIGKILL the run's process group and every process it started (Ray's raylet, workers, engines: some leave
        the group), and wait until all of them are gone."""
        try:
            doomed = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            doomed = []
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for process in doomed:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        self.proc.wait(timeout=60)
        _, alive = psutil.wait_procs(doomed, timeout=60)
        assert not alive, f"processes of the killed run still alive: {alive}"


def run_keeping_checkpoint(
    algorithm: str, workdir: Path, step: int, keep_as: Path, *overrides: str, config: str | None = None
) -> list[str]:
    """Run `entry_point_args` to the end (exit code 0) and keep its ``step_{step}`` checkpoint as ``keep_as`` the
    moment it is saved (hard links: no copy, and ``keep_top_k`` may remove the original later), so that a resume test
    restarts from the middle of this run instead of running the first part again. Attached to the test worker's Ray
    cluster (`shared_ray_env`). Returns the run's output lines."""
    run = LiveRun(entry_point_args(algorithm, workdir, *overrides, config=config), workdir, shared_ray_env())
    try:
        run.wait_for_line(f"step {step}: saved checkpoint", timeout_s=600)  # printed once the save is complete
        shutil.copytree(workdir / "ckpt" / f"step_{step}", keep_as, copy_function=os.link)
        code = run.wait_for_exit(timeout_s=600)
    except BaseException:
        run.kill()
        raise
    assert code == 0, "".join(run.lines[-60:])
    return run.lines


def read_metrics(log_dir: Path) -> dict[int, dict[str, float]]:
    """``metrics.jsonl`` of a run directory, merged per step."""
    steps: dict[int, dict[str, float]] = {}
    for line in (log_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        steps.setdefault(row.pop("step"), {}).update(row)
    return steps


def run_dirs(workdir: Path) -> list[Path]:
    """The ``exp_N`` log directories of ``workdir``, in run order."""
    return sorted((workdir / "logs").iterdir(), key=lambda p: int(p.name.split("_")[1]))


def small_llama(path: Path) -> Path:
    """A model folder (config and tokenizer, no weights) of a smaller Llama than tiny-random-llama: hidden 64 instead
    of 128, 1 layer instead of 2, the same tokenizer. Enough for anything that reads a model's identity."""
    from transformers import LlamaConfig

    from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer

    tokenizer = load_tokenizer(TINY_LLAMA)
    LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        architectures=["LlamaForCausalLM"],
    ).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def assert_checkpoint(step_dir: Path) -> None:
    """A complete ``step_N``: training info, weights, optimizer, tokenizer, dataloader + RNG state."""
    for name in (
        "training_info.json",
        "config.yaml",
        "train_dataloader.pt",
        "policy/weights",
        "policy/optimizer",
        "policy/tokenizer",
    ):
        assert (step_dir / name).exists(), f"{step_dir / name} is missing"


# Four fixed preference pairs the DPO and reward-model tests learn.
PAIRS = [
    ("What is 2 + 3?", "2 + 3 = 5.", "I refuse to answer that."),
    ("Name a primary colour.", "Red is a primary colour.", "Colours are not real."),
    ("What do bees make?", "Bees make honey.", "Bees make nothing at all, ever."),
    ("How many legs does a spider have?", "A spider has eight legs.", "Spiders have wheels."),
]


def pair_overrides(workdir: Path, section: str) -> list[str]:
    """Overrides that train ``section`` (``dpo`` / ``rm``) on :data:`PAIRS`, all 4 in every step, validating on them
    at the start and every 2 steps."""
    rows = [{"prompt": prompt, "chosen": chosen, "rejected": rejected} for prompt, chosen, rejected in PAIRS]
    path = write_jsonl(workdir / "pairs.jsonl", rows)
    return [
        "data.dataset_name=binary_preference",
        f"data.data_path={path}",
        f"data.val_data_path={path}",
        f"{section}.max_num_epochs=100",
        "policy.train_global_batch_size=4",
        "policy.train_micro_batch_size=2",
        f"{section}.val_at_start=true",
        f"{section}.val_period=2",
        f"{section}.val_global_batch_size=4",
        f"{section}.val_micro_batch_size=2",
    ]


def run_cut_and_resumed(
    algorithm: str, workdir: Path, *overrides: str, config: str | None = None
) -> dict[int, dict[str, float]]:
    """Run 4 steps, check the checkpoints, restart to 6 steps; the two runs' metrics merged per step (the restart
    must have resumed from step 4 and logged training steps 5 and 6 only). ``config``: see `entry_point_args`."""
    workdir.mkdir(exist_ok=True)
    run_entry_point(algorithm, workdir, *overrides, f"{algorithm}.max_num_steps=4", config=config)
    assert sorted(p.name for p in (workdir / "ckpt").iterdir()) == ["step_1", "step_2", "step_3", "step_4"]
    assert_checkpoint(workdir / "ckpt" / "step_4")
    proc = run_entry_point(algorithm, workdir, *overrides, f"{algorithm}.max_num_steps=6", config=config)
    assert "Resuming from checkpoint" in proc.stdout and "step_4 (step 4)" in proc.stdout
    first, second = (read_metrics(d) for d in run_dirs(workdir))
    assert sorted(s for s in second if "train/loss" in second[s]) == [5, 6]
    return {**first, **second}


def assert_trains_alike(
    algorithm: str, workdir: Path, expected: dict[int, dict[str, float]], *overrides: str, steps: int = 3
) -> dict[int, dict[str, float]]:
    """Run ``steps`` steps with ``overrides`` (no checkpoints) and assert each step's training loss and grad norm
    equal ``expected``'s (another run's metrics) to fp32 noise: for layouts that must not change the numbers, such
    as packed vs padded microbatches. Returns the run's metrics."""
    workdir.mkdir()
    run_entry_point(algorithm, workdir, *overrides, f"{algorithm}.max_num_steps={steps}", "checkpointing.enabled=false")
    (run_dir,) = run_dirs(workdir)
    metrics = read_metrics(run_dir)
    for step in range(1, steps + 1):
        for key, tolerance in (("train/loss", {"abs": 1e-5}), ("train/grad_norm", {"rel": 1e-4})):
            assert metrics[step][key] == pytest.approx(expected[step][key], **tolerance), (step, key)
    return metrics
