"""Reward-model training end to end on CPU (real Ray, FSDP2, `datasets`): `configs/rm_smoke.yaml` through
`examples/run_rm.py`.

A tiny random model with a fresh scalar head learns 4 fixed preference pairs (generic chosen/rejected JSONL), all 4
in every step; validation on the same pairs measures its accuracy before and after. The run is cut after 4 steps
and resumed to 6.
"""

from __future__ import annotations

import pytest

from tests.functional.supervised_runs import assert_checkpoint, read_metrics, run_dirs, run_entry_point, write_jsonl
from tests.functional.test_dpo import PAIRS


def pair_overrides(tmp_path) -> list[str]:
    rows = [{"prompt": prompt, "chosen": chosen, "rejected": rejected} for prompt, chosen, rejected in PAIRS]
    path = write_jsonl(tmp_path / "pairs.jsonl", rows)
    return [
        "data.dataset_name=binary_preference", f"data.data_path={path}", f"data.val_data_path={path}",
        "rm.max_num_epochs=100", "policy.train_global_batch_size=4", "policy.train_micro_batch_size=2",
        "rm.val_at_start=true", "rm.val_period=2", "rm.val_global_batch_size=4", "rm.val_micro_batch_size=2",
    ]


@pytest.mark.slow
def test_reward_model_learns_the_pairs_and_resumes(tmp_path):
    data = pair_overrides(tmp_path)
    run_entry_point("rm", tmp_path, *data, "rm.max_num_steps=4")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_1", "step_2", "step_3", "step_4"]
    assert_checkpoint(tmp_path / "ckpt" / "step_4")
    proc = run_entry_point("rm", tmp_path, *data, "rm.max_num_steps=6")
    assert "Resuming from checkpoint" in proc.stdout and "step_4 (step 4)" in proc.stdout

    first, second = (read_metrics(d) for d in run_dirs(tmp_path))
    assert sorted(s for s in second if "train/loss" in second[s]) == [5, 6]  # the restart continued at step 5
    metrics = {**first, **second}
    for step in range(1, 7):
        for key in ("loss", "accuracy", "rewards_chosen_mean", "rewards_rejected_mean", "reward_margin", "grad_norm",
                    "lr", "num_valid_samples"):
            assert f"train/{key}" in metrics[step], (step, key, sorted(metrics[step]))
        for key in ("data_processing", "policy_training", "total_step_time"):
            assert f"timing/train/{key}" in metrics[step], (step, key)
    for step in (0, 2, 4, 6):
        assert {"validation/loss", "validation/accuracy"} <= set(metrics[step]), step
    assert metrics[6]["validation/accuracy"] == 1.0
    assert metrics[0]["validation/accuracy"] < 1.0
    assert metrics[6]["validation/loss"] < metrics[0]["validation/loss"]
    assert metrics[6]["train/reward_margin"] > metrics[1]["train/reward_margin"]
