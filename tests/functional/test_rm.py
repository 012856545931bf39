"""Reward-model training end to end on CPU (real Ray, FSDP2, `datasets`): `configs/rm_smoke.yaml` through
`examples/run_rm.py`.

A tiny random model with a fresh scalar head learns 4 fixed preference pairs (generic chosen/rejected JSONL), all 4
in every step; validation on the same pairs measures its accuracy before and after. The run is cut after 4 steps
and resumed to 6.
"""

from __future__ import annotations

import pytest

from tests.functional.supervised_runs import assert_trains_alike, pair_overrides, run_cut_and_resumed


@pytest.mark.slow
def test_reward_model_learns_the_pairs_and_resumes(tmp_path):
    pairs = pair_overrides(tmp_path, "rm")
    metrics = run_cut_and_resumed("rm", tmp_path / "run", *pairs)
    for step in range(1, 7):
        for key in (
            "loss",
            "accuracy",
            "rewards_chosen_mean",
            "rewards_rejected_mean",
            "reward_margin",
            "grad_norm",
            "lr",
            "num_valid_samples",
        ):
            assert f"train/{key}" in metrics[step], (step, key, sorted(metrics[step]))
        for key in ("data_processing", "policy_training", "total_step_time"):
            assert f"timing/train/{key}" in metrics[step], (step, key)
    for step in (0, 2, 4, 6):
        assert {"validation/loss", "validation/accuracy"} <= set(metrics[step]), step
    assert metrics[6]["validation/accuracy"] == 1.0
    assert metrics[0]["validation/accuracy"] < 1.0
    assert metrics[6]["validation/loss"] < metrics[0]["validation/loss"]
    assert metrics[6]["train/reward_margin"] > metrics[1]["train/reward_margin"]
    # Packed microbatches (each pair kept whole, chosen before rejected, in one row) train as the padded ones.
    packed = assert_trains_alike("rm", tmp_path / "packed", metrics, *pairs, "policy.sequence_packing.enabled=true")
    assert {packed[step]["performance/train_padding_fraction"] for step in (1, 2, 3)} == {0.0}
    padding = [metrics[step]["performance/train_padding_fraction"] for step in (1, 2, 3)]
    assert min(padding) > 0.02, padding  # there was padding to remove, so the equality above means something
