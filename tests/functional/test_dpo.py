"""DPO end to end on CPU (real Ray, FSDP2, `datasets`): `configs/dpo_smoke.yaml` through `examples/run_dpo.py`.

A tiny random model learns 4 fixed preference pairs (generic chosen/rejected JSONL), all 4 in every step: at step 1
the policy equals its reference, so the loss is exactly log 2; then the chosen-vs-rejected reward margin grows. The
run is cut after 4 steps and resumed to 6.
"""

from __future__ import annotations

import math

import pytest

from tests.functional.supervised_runs import assert_checkpoint, read_metrics, run_dirs, run_entry_point, write_jsonl

PAIRS = [
    ("What is 2 + 3?", "2 + 3 = 5.", "I refuse to answer that."),
    ("Name a primary colour.", "Red is a primary colour.", "Colours are not real."),
    ("What do bees make?", "Bees make honey.", "Bees make nothing at all, ever."),
    ("How many legs does a spider have?", "A spider has eight legs.", "Spiders have wheels."),
]


def pair_overrides(tmp_path) -> list[str]:
    rows = [{"prompt": prompt, "chosen": chosen, "rejected": rejected} for prompt, chosen, rejected in PAIRS]
    path = write_jsonl(tmp_path / "pairs.jsonl", rows)
    return [
        "data.dataset_name=binary_preference", f"data.data_path={path}", f"data.val_data_path={path}",
        "dpo.max_num_epochs=100", "policy.train_global_batch_size=4", "policy.train_micro_batch_size=2",
        "dpo.val_at_start=true", "dpo.val_period=2", "dpo.val_global_batch_size=4", "dpo.val_micro_batch_size=2",
    ]


@pytest.mark.slow
def test_dpo_starts_at_log2_grows_the_margin_and_resumes(tmp_path):
    data = pair_overrides(tmp_path)
    run_entry_point("dpo", tmp_path, *data, "dpo.max_num_steps=4")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_1", "step_2", "step_3", "step_4"]
    assert_checkpoint(tmp_path / "ckpt" / "step_4")
    proc = run_entry_point("dpo", tmp_path, *data, "dpo.max_num_steps=6")
    assert "Resuming from checkpoint" in proc.stdout and "step_4 (step 4)" in proc.stdout

    first, second = (read_metrics(d) for d in run_dirs(tmp_path))
    assert sorted(s for s in second if "train/loss" in second[s]) == [5, 6]  # the restart continued at step 5
    metrics = {**first, **second}
    for step in range(1, 7):
        for key in ("loss", "sft_loss", "preference_loss", "accuracy", "rewards_chosen_mean", "rewards_rejected_mean",
                    "reward_margin", "grad_norm", "lr", "num_valid_samples"):
            assert f"train/{key}" in metrics[step], (step, key, sorted(metrics[step]))
        for key in ("data_processing", "policy_training", "total_step_time"):
            assert f"timing/train/{key}" in metrics[step], (step, key)
        assert metrics[step]["train/num_valid_samples"] == 4  # pairs
    # Step 1: policy == reference, so every reward is 0 and −log σ(0) = log 2.
    assert metrics[1]["train/loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert metrics[1]["train/reward_margin"] == pytest.approx(0.0, abs=1e-4)
    margins = [metrics[step]["train/reward_margin"] for step in range(1, 7)]
    assert margins[1] > margins[0] and margins[-1] > margins[1], margins
    assert metrics[6]["train/loss"] < metrics[1]["train/loss"], margins
    # Validation on the same pairs before training (log 2, margin 0) and after 6 steps.
    assert metrics[0]["validation/loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert metrics[6]["validation/reward_margin"] > metrics[2]["validation/reward_margin"] > 0
    assert metrics[6]["validation/accuracy"] == 1.0
