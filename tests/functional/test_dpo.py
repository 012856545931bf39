"""DPO end to end on CPU (real Ray, FSDP2, `datasets`): `configs/dpo_smoke.yaml` through `examples/run_dpo.py`.

A tiny random model learns 4 fixed preference pairs (generic chosen/rejected JSONL), all 4 in every step: at step 1
the policy equals its reference, so the loss is exactly log 2; then the chosen-vs-rejected reward margin grows. The
run is cut after 4 steps and resumed to 6.
"""

from __future__ import annotations

import math

import pytest

from tests.functional.supervised_runs import (
    assert_trains_alike,
    pair_overrides,
    read_metrics,
    run_cut_and_resumed,
    run_dirs,
    run_entry_point,
)


@pytest.mark.slow
def test_dpo_starts_at_log2_grows_the_margin_and_resumes(tmp_path):
    pairs = pair_overrides(tmp_path, "dpo")
    metrics = run_cut_and_resumed("dpo", tmp_path / "run", *pairs)
    for step in range(1, 7):
        for key in (
            "loss",
            "sft_loss",
            "preference_loss",
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
    # Packed microbatches (each pair kept whole, chosen before rejected, in one row) train as the padded ones.
    packed = assert_trains_alike("dpo", tmp_path / "packed", metrics, *pairs, "policy.sequence_packing.enabled=true")
    assert {packed[step]["performance/train_padding_fraction"] for step in (1, 2, 3)} == {0.0}
    padding = [metrics[step]["performance/train_padding_fraction"] for step in (1, 2, 3)]
    assert min(padding) > 0.02, padding  # there was padding to remove, so the equality above means something


@pytest.mark.slow
def test_dpo_with_lora_measures_against_the_base_model(tmp_path):
    """With LoRA the reference is the base model (adapters off): step 1 is again exactly log 2, and training the
    adapters alone grows the margin."""
    workdir = tmp_path / "lora"
    workdir.mkdir()
    pairs = pair_overrides(workdir, "dpo")
    lora = ["policy.dtensor_cfg.lora_cfg.enabled=true", "policy.optimizer.kwargs.lr=1e-2"]
    run_entry_point("dpo", workdir, *pairs, *lora, "dpo.max_num_steps=4", "checkpointing.enabled=false")
    (run_dir,) = run_dirs(workdir)
    metrics = read_metrics(run_dir)
    assert metrics[1]["train/loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert metrics[1]["train/reward_margin"] == pytest.approx(0.0, abs=1e-4)
    margins = [metrics[step]["train/reward_margin"] for step in range(1, 5)]
    assert margins[-1] > margins[1] > margins[0], margins
    assert metrics[4]["train/loss"] < metrics[1]["train/loss"] - 0.01, metrics[4]["train/loss"]
