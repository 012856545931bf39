"""The progress watchdog on a real run. The environment actor, then a policy worker, is stopped with SIGSTOP until
the watchdog's warning names it (by actor, pid and call), then resumed: the run goes on. Then one rank of the engine
(two tensor-parallel ranks) is stopped for good: the engine is named within the bound, the run stops with exit code
124, and nothing it started is left running, the stopped rank included."""

from __future__ import annotations

import re
import signal
import time

import psutil
import pytest

from nemo_rl_clone.utils.watchdog import WATCHDOG_EXIT_CODE
from tests.functional.supervised_runs import LiveRun, entry_point_args, read_metrics, run_dirs, run_entry_point
from tests.functional.test_grpo import grpo_args

# Tiny-model phases take about a second: warn after 5 s, stop after 20 s (or 3x / 10x a phase's median if longer);
# on a loaded CI machine a healthy phase of step 1 may pass 5 s and be named too, never 20 s.
BOUNDS = (
    "watchdog.warn_min_s=5",
    "watchdog.warn_factor=3",
    "watchdog.stop_min_s=20",
    "watchdog.stop_factor=10",
    "watchdog.poll_s=0.5",
)


# Two bundles, shared by two policy workers and one engine of two tensor-parallel ranks (vLLM's own rank processes).
TP2_ENGINE = ("cluster.gpus_per_node=2", "policy.generation.vllm_cfg.tensor_parallel_size=2")


def _all(tree: list[psutil.Process], title: str) -> list[psutil.Process]:
    return [p for p in tree if " ".join(p.cmdline()).startswith(f"ray::{title}")]


def _one(tree: list[psutil.Process], title: str) -> psutil.Process:
    (process,) = _all(tree, title)
    return process


def _named_while_stopped(run: LiveRun, process: psutil.Process) -> str:
    """Stop ``process`` until a watchdog warning names it, then let it go on; that warning."""
    process.send_signal(signal.SIGSTOP)
    try:
        while f"(pid {process.pid})" not in (line := run.wait_for_line("watchdog: step ", timeout_s=60)):
            pass
    finally:
        process.send_signal(signal.SIGCONT)
    return line


def test_stalled_workers_are_named_and_a_stopped_engine_stops_the_run(tmp_path):
    run = LiveRun(grpo_args(tmp_path, "grpo.max_num_steps=10", "grpo.val_period=100", *TP2_ENGINE, *BOUNDS), tmp_path)
    try:
        run.wait_for_line("step 1: saved checkpoint", timeout_s=300)  # step 2 starts next
        tree = psutil.Process(run.proc.pid).children(recursive=True)
        environment, policy = _one(tree, "ReasoningGymEnvironment"), _all(tree, "DTensorPolicyWorker")[-1]
        # the driver's step call to the environment actor waits (step 2's rollout)
        env_warning = _named_while_stopped(run, environment)
        run.wait_for_line("step 3: saved checkpoint", timeout_s=120)
        # step 4's first call to the policy worker waits (its weight sync: the smoke run's samples rarely train)
        policy_warning = _named_while_stopped(run, policy)
        saved = run.wait_for_line("step ", timeout_s=120)
        while ": saved checkpoint" not in saved:
            saved = run.wait_for_line("step ", timeout_s=120)
        engine = _one(tree, "VllmGenerationWorker")  # the actor; its ranks are its children
        ranks = [p for p in engine.children(recursive=True) if "Worker_" in " ".join(p.cmdline())]
        assert len(ranks) == 2, [" ".join(p.cmdline()) for p in engine.children(recursive=True)]
        stopped_rank = max(ranks, key=lambda p: " ".join(p.cmdline()))  # Worker_TP1: not the actor's process
        stopped_rank.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        code = run.wait_for_exit(timeout_s=120)
        took = time.monotonic() - stopped_at
        errors = "".join(run.err_lines)
        # the reaper ends every process of the run, the stopped rank included
        _, alive = psutil.wait_procs([*tree, *ranks], timeout=60)
        assert not alive, f"left running: {[p.pid for p in alive]}"
    finally:
        run.kill()
    assert code == WATCHDOG_EXIT_CODE, "".join(run.lines)[-3000:]
    named = rf"vllm_policy-0 \(pid {engine.pid}\) \w+ for \d+ s"
    (warning,) = [line for line in run.err_lines if line.startswith("watchdog: step ") and str(engine.pid) in line]
    # a refit cut by the stop waits on the engine and on the trainer rank sending to it: the engine is among them
    assert re.search(r"has run \d+ s \(warns after \d+ s, stops the run after \d+ s\): waiting on ", warning)
    assert re.search(named, warning), warning
    (verdict,) = [line for line in run.err_lines if line.startswith("Stopped by the watchdog: step ")]
    assert re.search(r"made no progress for \d+ s \(bound \d+ s\): waiting on ", verdict), verdict
    assert re.search(named, verdict), verdict
    assert f"(its process {stopped_rank.pid} (" in verdict and ") is stopped)" in verdict, verdict
    assert "last complete checkpoint:" in verdict and "Resume: uv run" in verdict, verdict
    stack = re.search(r"\(stack: (\S+)\)", verdict)
    assert stack, verdict
    with open(stack.group(1)) as dump:  # py-spy's dump of the stopped engine: its Python threads
        text = dump.read()  # the actor's threads, then each rank's (the stopped one read without pausing it)
        assert f"Process {engine.pid}:" in text and f"Process {stopped_rank.pid}:" in text, text[:2000]
    assert "Traceback" not in errors, errors[-3000:]
    assert re.search(rf"waiting on \S*ReasoningGymEnvironment\S* \(pid {environment.pid}\) step for \d+ s", env_warning)
    # both ranks may be named: the running one waits in the collective for the stopped one
    assert re.search(
        rf"waiting on (\S+ \(pid \d+\) \w+ for \d+ s( \(stack: \S+\))?; )*lm_policy-\d \(pid {policy.pid}\) \w+ for \d+ s",
        policy_warning,
    ), policy_warning
    print(f"stopped {took:.1f} s after SIGSTOP:\n{env_warning}{policy_warning}{warning}{verdict}")


def test_a_trainer_rank_whose_peer_is_stopped_times_out_in_its_collective_and_the_run_resumes_exactly(tmp_path):
    """SFT on two policy workers with a 5 s collective timeout (`watchdog.collective_timeout_s`): one rank stopped
    during training leaves the other waiting in FSDP's collectives. That rank fails once the timeout passes, long
    before the watchdog's bounds, and the run stops with one line on stderr naming the call and gloo's words (exit
    code 1), leaving nothing running — the stopped rank included. Resumed from the last checkpoint it names, the run
    then trains exactly as one that was never stopped (its steps' losses and grad norms to fp32 noise)."""
    common = ("sft.max_num_steps=6", "sft.val_period=0", "cluster.gpus_per_node=2")
    cut, straight = tmp_path / "cut", tmp_path / "straight"
    cut.mkdir(), straight.mkdir()
    overrides = (*common, "checkpointing.save_period=1", "watchdog.collective_timeout_s=5")
    run = LiveRun(entry_point_args("sft", cut, *overrides, config="sft_smoke.yaml"), cut)
    try:
        while "step 2: training" not in run.wait_for_line("", timeout_s=300):  # a log line, after its time
            pass
        tree = psutil.Process(run.proc.pid).children(recursive=True)
        ranks = [p for p in tree if " ".join(p.cmdline()).startswith("ray::DTensorPolicyWorker")]
        assert len(ranks) == 2, ranks
        ranks[1].send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        code = run.wait_for_exit(timeout_s=180)
        print(f"exit {code} {time.monotonic() - stopped_at:.1f} s after SIGSTOP")
        _, alive = psutil.wait_procs(tree, timeout=60)
        assert not alive, f"left running: {[p.pid for p in alive]}"
    finally:
        run.kill()
    assert code == 1, "".join(run.lines)[-3000:]
    (verdict,) = [line for line in run.err_lines if line.startswith("Stopped during step ")]
    timed_out = (
        r"a collective timed out \(raised by worker rank 0 in \S+\): Timed out waiting 5000 ?ms for \w+ operation"
    )
    assert re.search(timed_out, verdict), verdict
    assert "Resume: uv run" in verdict, verdict
    assert "Traceback" not in "".join(run.err_lines), "".join(run.err_lines)[-3000:]
    last = re.search(r"last complete checkpoint: \S*step_(\d+)", verdict)
    assert last, verdict
    saved = int(last.group(1))
    assert 1 <= saved < 6, verdict

    # The resume (the default timeout again) and a run never stopped, on the test worker's Ray cluster.
    resumed = run_entry_point("sft", cut, *common, config="sft_smoke.yaml")
    assert f"step_{saved} (step {saved})" in resumed.stdout, resumed.stdout[-3000:]
    run_entry_point("sft", straight, *common, "checkpointing.enabled=false", config="sft_smoke.yaml")
    got, expected = read_metrics(run_dirs(cut)[-1]), read_metrics(run_dirs(straight)[-1])
    assert sorted(s for s in got if "train/loss" in got[s]) == list(range(saved + 1, 7)), sorted(got)
    for step in range(saved + 1, 7):
        assert got[step]["train/loss"] == pytest.approx(expected[step]["train/loss"], abs=1e-5), step
        assert got[step]["train/grad_norm"] == pytest.approx(expected[step]["train/grad_norm"], rel=1e-4), step
