"""Random kills, measured: a GRPO run whose processes are SIGKILLed at random moments ends exactly as a straight run.

The run is `configs/grpo_smoke.yaml` (the tiny random Llama) with a reward it can earn: DAPO's overlong penalty over
responses cut by a stop string, so rewards vary within groups and every step trains (a zero-advantage run would make
"the same final weights" trivially true). One straight run, then one run that is killed again and again: each trial
starts it (it resumes from its latest checkpoint), SIGKILLs one process of a kind drawn at random (the driver, the
vLLM worker, the policy worker) at a random moment (during start-up, or during the steps) and checks what is left:
the one-line verdict, no process of the run still running, every checkpoint passing its manifest. Before the final
resume the newest checkpoint is damaged (where an older one remains), so the resume must fall back past it; during
that final run an environment actor is killed, which the run survives (Ray restarts it and retries its step). The
final rewards, losses and weights must equal the straight run's.

``NRL_CHAOS_SEED`` replays a failing draw (the seed is printed); docs/logging_and_checkpoints.md reports trials.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import torch

from nemo_rl_clone.utils.checkpoint_manifest import verify_checkpoint
from tests.functional.supervised_runs import LiveRun, read_metrics, run_dirs
from tests.functional.test_grpo import LENGTH_REWARD, final_weights, run_grpo, start_grpo

STEPS = 6  # each trial moves the run on by at most one step (killed within 1 s of its first new one): the final
# run, which an environment actor kill must not stop, still has 3 or more steps to go
CHAOS = (
    f"grpo.max_num_steps={STEPS}",
    f"data.reasoning_gym.train_size={4 * STEPS}",  # one epoch of 4 prompts a step
    f"grpo.val_period={STEPS}",
    "checkpointing.keep_top_k=2",
    *LENGTH_REWARD,
)
# Process titles Ray gives the run's actors (`ray::<Class>` or `ray::<Class>.<method>`).
KINDS = {
    "driver": None,
    "vllm worker": ("ray::VllmGenerationWorker",),
    "policy worker": ("ray::DTensorPolicyWorker",),
    "environment actor": ("ray::ReasoningGymEnvironment", "ray::ReasoningGymScorer"),
}


@dataclass
class Trial:
    kind: str
    moment: str
    delay_s: float
    exit_code: int
    verdict: str
    seconds: float
    tail: str  # the run's last lines, for a failure's message
    stderr: str


def _descendants(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(pid).children(recursive=True)
    return []


def _find(run: LiveRun, titles: tuple[str, ...], timeout_s: float = 180) -> list[psutil.Process]:
    """The run's processes with one of ``titles``; empty once the run has ended."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and run.proc.poll() is None:
        found = []
        for process in _descendants(run.proc.pid):
            with contextlib.suppress(psutil.NoSuchProcess):
                if any(" ".join(process.cmdline()).startswith(title) for title in titles):
                    found.append(process)
        if found:
            return found
        time.sleep(0.05)
    assert run.proc.poll() is not None, f"no {titles} process appeared within {timeout_s} s"
    return []


def _verdict(lines: list[str]) -> str:
    """The run's one-line account of its end (the last line that names a stop, an error or completion)."""
    marks = ("Stopped ", "error: ", "Done after step ")
    found = [line.strip() for line in lines if line.startswith(marks)]
    return found[-1] if found else ""


def _kill_one(workdir: Path, kind: str, rng: random.Random, moments: tuple[str, ...]) -> Trial:
    run = start_grpo(workdir, *CHAOS)
    started = time.monotonic()
    try:
        _find(run, KINDS["policy worker"])  # the run is up to its workers
        moment = rng.choice(moments)
        if moment == "steps":  # after this process's first new step, so that every trial moves the run on
            run.wait_for_line("step ", timeout_s=180)
            delay = rng.uniform(0.0, 1.0)
        else:
            delay = rng.uniform(0.0, 3.0)
        time.sleep(delay)
        titles = KINDS[kind]
        targets = [psutil.Process(run.proc.pid)] if titles is None else _find(run, titles)
        everything = [psutil.Process(run.proc.pid), *_descendants(run.proc.pid)] if targets else []
        if targets:
            rng.choice(targets).send_signal(signal.SIGKILL)
        exit_code = run.wait_for_exit(timeout_s=180)
    except BaseException:
        run.kill()
        raise
    left = psutil.wait_procs(everything, timeout=60)[1]  # the reaper ends what a killed driver leaves
    assert not left, f"left running after a {kind} kill: {[' '.join(p.cmdline())[:80] for p in left]}"
    seconds = time.monotonic() - started
    keep = os.environ.get("NRL_CHAOS_LOGS")  # a directory to keep each trial's output in
    if keep:
        Path(keep, f"{kind.replace(' ', '_')}.log").write_text("".join(run.lines))
    return Trial(
        kind, moment, delay, exit_code, _verdict(run.lines), seconds, "".join(run.lines[-30:]), "".join(run.err_lines)
    )


def _check_checkpoints(ckpt: Path) -> None:
    for step_dir in sorted(ckpt.glob("step_*")):
        assert verify_checkpoint(step_dir) is None, step_dir


def _merged_metrics(workdir: Path) -> dict[int, dict[str, float]]:
    """Per step, what the last process that ran it logged (a killed process may have logged part of a step)."""
    merged: dict[int, dict[str, float]] = {}
    for run_dir in run_dirs(workdir):
        if (run_dir / "metrics.jsonl").is_file():
            for step, metrics in read_metrics(run_dir).items():
                if "train/loss" in metrics:
                    merged[step] = metrics
    return merged


# Five runs start and stop here (~250 s on a 2-core host, twice that on a slow one): above pytest's default 600 s.
@pytest.mark.timeout(1500)
@pytest.mark.xdist_group("chaos")
def test_random_kills_then_resumes_end_like_a_straight_run(tmp_path):
    seed = int(os.environ.get("NRL_CHAOS_SEED", time.time_ns() % 1_000_000))
    print(f"NRL_CHAOS_SEED={seed}")
    rng = random.Random(seed)
    straight, chaos = tmp_path / "straight", tmp_path / "chaos"
    straight.mkdir(), chaos.mkdir()
    run_grpo(straight, *CHAOS)
    expected = _merged_metrics(straight)
    assert sorted(expected) == list(range(1, STEPS + 1))
    assert all(expected[s]["train/grad_norm"] > 0 for s in expected), expected  # every step really trains

    def report(trial: Trial) -> None:
        print(
            f"{trial.kind}, {trial.moment} +{trial.delay_s:.1f} s: exit {trial.exit_code} after {trial.seconds:.0f} s;"
        )
        print(f"  {trial.verdict[:300]}")

    # each fatal kind once, in random order, at a random moment of start-up or of the steps
    for kind in rng.sample(["driver", "vllm worker", "policy worker"], 3):
        trial = _kill_one(chaos, kind, rng, ("start-up", "steps", "steps"))
        report(trial)
        if kind == "driver":
            assert trial.exit_code == -signal.SIGKILL, trial
        else:
            # one line names the dead worker (or the failed start-up), the last complete checkpoint and the resume
            assert trial.exit_code in (1, 2), trial.tail
            assert "worker died" in trial.verdict or trial.verdict.startswith("error: "), trial.tail
        _check_checkpoints(chaos / "ckpt")

    # damage the newest checkpoint: the resume must set it aside and redo its step from the one before (only where
    # there is one before: with no checkpoint left that passes, a run refuses to start, by design)
    saved = sorted(chaos.glob("ckpt/step_*"), key=lambda p: int(p.name.split("_")[1]))
    newest = saved[-1] if len(saved) >= 2 else None
    print(f"damaged: {newest.name if newest else 'none'} ({len(saved)} checkpoints)")
    if newest is not None:
        weights = next((newest / "policy" / "weights").glob("*.distcp"))
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    # The final resume, with an environment actor killed during its steps: Ray restarts environment actors and retries
    # their steps (max_restarts=-1), so the run goes on to its end. (Should it not survive, the run is resumed once more
    # and the results must still be equal.)
    final = _kill_one(chaos, "environment actor", rng, ("steps",))
    report(final)
    if newest is not None:
        assert f"Checkpoint {newest} fails verification: policy/weights/{weights.name} has" in final.stderr, final.tail
        assert (chaos / "ckpt" / f"corrupt_{newest.name}").is_dir()
    if final.exit_code != 0:
        assert final.exit_code in (1, 2) and "worker died" in final.verdict, final.tail
        run_grpo(chaos, *CHAOS)
    else:
        assert final.verdict.startswith(f"Done after step {STEPS}"), final.tail
    _check_checkpoints(chaos / "ckpt")

    got = _merged_metrics(chaos)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        # identical samples (seeded per step and row) and restored weights and optimizer: rewards exact, losses to
        # fp32 summation noise
        assert got[step]["train/reward"] == expected[step]["train/reward"], step
        assert got[step]["train/loss"] == pytest.approx(expected[step]["train/loss"], abs=1e-6), step
        assert got[step]["train/grad_norm"] == pytest.approx(expected[step]["train/grad_norm"], rel=1e-4), step
    assert got[STEPS]["validation/mean_reward"] == expected[STEPS]["validation/mean_reward"]
    weights_now, reference = final_weights(chaos, STEPS), final_weights(straight, STEPS)
    assert weights_now.keys() == reference.keys()
    for name, tensor in weights_now.items():
        torch.testing.assert_close(tensor, reference[name], rtol=0, atol=1e-6, msg=name)
