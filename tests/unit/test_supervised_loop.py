"""The pure parts of the SFT / DPO / RM loop: metric reduction, validation batches and their combination, epoch
accounting, run state in checkpoints (top-k by a validation metric), and the configs' cross-section checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nemo_rl_clone.algorithms.dpo import DPOAlgorithm, DPOConfig, DPOMasterConfig
from nemo_rl_clone.algorithms.rm import RMAlgorithm, RMMasterConfig
from nemo_rl_clone.algorithms.run.cli import run_algorithm_cli
from nemo_rl_clone.algorithms.run.state import RunState
from nemo_rl_clone.algorithms.sft import SFTAlgorithm, SFTMasterConfig
from nemo_rl_clone.algorithms.supervised.config import SupervisedLoopConfig
from nemo_rl_clone.algorithms.supervised.loop import step_metrics
from nemo_rl_clone.algorithms.supervised.setup import validation_batches
from nemo_rl_clone.algorithms.utils import combine_batches, reduce_train_results
from nemo_rl_clone.data.dataloader import StatefulPromptLoader
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.utils.checkpoint import CheckpointingConfig, CheckpointManager
from nemo_rl_clone.utils.config import load_validated_config
from nemo_rl_clone.utils.config_validation import ConfigError, validate_config

REPO = Path(__file__).resolve().parents[2]


def train_results(mb: dict[str, list[float]], grad_norm: list[float], num_global_batches: int = 1) -> dict:
    return {
        "all_mb_metrics": mb,
        "grad_norm": torch.tensor(grad_norm),
        "num_global_batches": num_global_batches,
        "loss": torch.zeros(num_global_batches),
    }


# ------------------------------------------------------------------------------------------------ metric reduction


def test_reduce_train_results_sums_shares_and_counts():
    results = train_results(
        {"loss": [0.25, 0.5, 0.75, 1.0], "num_valid_samples": [2, 2, 1, 3], "lr": [1e-3, 1e-3, 2e-3, 2e-3]},
        grad_norm=[1.0, 3.0],
        num_global_batches=2,
    )
    metrics = reduce_train_results(results, ("loss",), ("num_valid_samples",))
    # 4 microbatch shares of 2 global means: (0.25 + 0.5 + 0.75 + 1.0) / 2 optimizer steps.
    assert metrics == {"loss": 1.25, "num_valid_samples": 8.0, "grad_norm": 2.0, "lr": 2e-3}


def test_reduce_train_results_leaves_out_missing_metrics():
    metrics = reduce_train_results(
        train_results({"loss": [1.0]}, [0.5]), ("loss", "kl_penalty"), ("num_valid_samples",)
    )
    assert metrics == {"loss": 1.0, "grad_norm": 0.5}


def test_preference_metrics_add_the_reward_margin():
    results = train_results(
        {
            "loss": [0.3, 0.4],
            "sft_loss": [1.0, 1.0],
            "preference_loss": [0.3, 0.4],
            "accuracy": [0.5, 0.25],
            "rewards_chosen_mean": [0.2, 0.1],
            "rewards_rejected_mean": [-0.1, 0.05],
            "num_valid_samples": [2, 2],
            "lr": [1e-5, 1e-5],
        },
        grad_norm=[0.7],
    )
    algorithm = DPOAlgorithm(loss_fn=None)
    metrics = algorithm.train_metrics(step_metrics(algorithm, results))
    assert metrics["accuracy"] == pytest.approx(0.75)
    assert metrics["reward_margin"] == pytest.approx(0.3 - (-0.05))
    assert set(metrics) == set(DPOAlgorithm.train_metric_names)


def test_sft_validation_metric_is_named_val_loss():
    assert SFTAlgorithm(None).validation_metrics({"loss": 2.5, "num_valid_samples": 4.0}) == {
        "val_loss": 2.5,
        "num_valid_samples": 4.0,
    }


def test_combine_batches_weights_by_valid_samples():
    per_batch = [
        {"loss": 1.0, "accuracy": 1.0, "num_valid_samples": 3.0},
        {"loss": 4.0, "accuracy": 0.0, "num_valid_samples": 1.0},
        {"loss": 99.0, "accuracy": 0.5, "num_valid_samples": 0.0},
    ]  # no valid sample: no weight
    combined = combine_batches(per_batch, ("loss", "accuracy"), ("num_valid_samples",))
    assert combined == {"loss": pytest.approx(7.0 / 4.0), "accuracy": pytest.approx(0.75), "num_valid_samples": 4.0}


def test_combine_batches_without_valid_samples_is_a_plain_mean():
    per_batch = [{"loss": 0.0, "num_valid_samples": 0.0}, {"loss": 0.0, "num_valid_samples": 0.0}]
    assert combine_batches(per_batch, ("loss",), ("num_valid_samples",)) == {"loss": 0.0, "num_valid_samples": 0.0}


# ------------------------------------------------------------------------------------------------ data plumbing


def collate(items: list[int]) -> BatchedDataDict:
    return BatchedDataDict(value=torch.tensor(items))


def test_completed_epochs_counts_an_epoch_when_its_last_batch_is_drawn():
    loader = StatefulPromptLoader(list(range(6)), batch_size=2, collate_fn=collate, shuffle=False)
    batches = iter(loader)
    seen = []
    for _ in range(4):
        next(batches)
        seen.append(loader.completed_epochs)
    assert seen == [0, 0, 1, 1]  # 3 batches per epoch; the 4th batch starts epoch 2


def test_validation_batches_are_the_first_full_batches_in_order():
    loop = SupervisedLoopConfig(val_global_batch_size=3, val_batches=2)
    batches = validation_batches(list(range(10)), loop, collate, "sft")
    assert [b["value"].tolist() for b in batches] == [[0, 1, 2], [3, 4, 5]]
    loop.val_batches = 0  # all full batches; the incomplete last one is dropped
    assert len(validation_batches(list(range(10)), loop, collate, "sft")) == 3


def test_validation_batches_name_the_key_when_the_set_is_too_small():
    loop = SupervisedLoopConfig(val_global_batch_size=8)
    with pytest.raises(ValueError, match=r"dpo.val_global_batch_size: .* batch of 8 examples, the data has 5 "):
        validation_batches(list(range(5)), loop, collate, "dpo")
    with pytest.raises(ValueError, match="no validation set"):
        validation_batches(None, loop, collate, "sft")
    assert validation_batches(None, SupervisedLoopConfig(val_period=0, val_at_start=False), collate, "sft") == []


# ------------------------------------------------------------------------------------------------ run state


def test_run_state_round_trips_through_training_info():
    state = RunState(step=7, total_valid_samples=56, val_metrics={"val_loss": 1.5}, train_metrics={"loss": 2.0})
    assert RunState.from_training_info(state.training_info()) == state


def test_top_k_keeps_the_checkpoints_with_the_lowest_validation_loss(tmp_path):
    cfg = CheckpointingConfig(
        checkpoint_dir=str(tmp_path), metric_name="val:val_loss", higher_is_better=False, keep_top_k=2
    )
    manager = CheckpointManager(cfg)
    for step, val_loss in ((2, 3.0), (4, 1.0), (6, 2.0), (8, 5.0)):
        state = RunState(step=step, val_metrics={"val_loss": val_loss})
        manager.finalize_checkpoint(manager.init_tmp_checkpoint(step, state.training_info()))
    # the 2 best (steps 4 and 6) plus the latest (step 8)
    assert [step for step, _ in manager.list_checkpoints()] == [4, 6, 8]
    assert manager.get_best_checkpoint_path().name == "step_4"


# ------------------------------------------------------------------------------------------------ configs


@pytest.mark.parametrize(
    ("schema", "path"),
    [
        (SFTMasterConfig, "sft.yaml"),
        (SFTMasterConfig, "sft_smoke.yaml"),
        (DPOMasterConfig, "dpo.yaml"),
        (DPOMasterConfig, "dpo_smoke.yaml"),
        (RMMasterConfig, "rm.yaml"),
        (RMMasterConfig, "rm_smoke.yaml"),
    ],
)
def test_shipped_configs_validate(schema, path):
    config = load_validated_config(REPO / "configs" / path, [], schema)
    assert config.data.max_input_seq_length == config.policy.max_total_sequence_length


def test_dpo_config_feeds_the_loss():
    config = load_validated_config(
        REPO / "configs" / "dpo.yaml", ["dpo.preference_average_log_probs=true"], DPOMasterConfig
    )
    loss = config.dpo.loss_config()
    assert (loss.reference_policy_kl_penalty, loss.preference_loss_weight, loss.sft_loss_weight) == (0.05, 1.0, 0.0)
    assert loss.sft_average_log_probs is True  # dpo.yaml interpolates it from preference_average_log_probs


def with_base(data: dict) -> dict:
    """``data`` over a valid base: the data section's default length (1024) within the policy's."""
    merged = {"policy": {"max_total_sequence_length": 1024}}
    for key, value in data.items():
        merged[key] = {**merged.get(key, {}), **value}
    return merged


def problems(schema: type, data: dict) -> list[str]:
    with pytest.raises(ConfigError) as error:
        validate_config(with_base(data), schema)
    return error.value.problems


def test_default_sections_with_a_long_enough_policy_are_valid():
    for schema in (SFTMasterConfig, DPOMasterConfig):
        validate_config(with_base({}), schema)
    validate_config(with_base({"policy": {"reward_model_cfg": {"enabled": True}}}), RMMasterConfig)
    found = problems(SFTMasterConfig, {"policy": {"max_total_sequence_length": 512}})
    assert found == ["data.max_input_seq_length: exceeds policy.max_total_sequence_length (1024 > 512)"]


def test_dpo_rejects_a_non_positive_beta():
    assert problems(DPOMasterConfig, {"dpo": {"reference_policy_kl_penalty": 0.0}}) == [
        "dpo.reference_policy_kl_penalty: must be > 0 (the DPO β), got 0.0"
    ]
    assert DPOConfig().loss_config().reference_policy_kl_penalty == 0.05


def test_preference_algorithms_refuse_row_reordering():
    found = problems(
        DPOMasterConfig,
        {"policy": {"dynamic_batching": {"enabled": True, "train_mb_tokens": 256, "logprob_mb_tokens": 256}}},
    )
    assert len(found) == 1 and found[0].startswith("policy.dynamic_batching.enabled: dpo needs the chosen and rejected")


def test_reward_model_mode_must_match_the_algorithm():
    assert problems(RMMasterConfig, {}) == [
        "policy.reward_model_cfg.enabled: must be true: reward-model training needs a scalar head"
    ]
    assert problems(SFTMasterConfig, {"policy": {"reward_model_cfg": {"enabled": True}}}) == [
        "policy.reward_model_cfg.enabled: must be false for sft"
    ]


def test_batch_sizes_must_split_over_data_parallel_ranks():
    found = problems(
        DPOMasterConfig,
        {"cluster": {"gpus_per_node": 4}, "policy": {"train_global_batch_size": 6, "train_micro_batch_size": 1}},
    )
    assert found == ["policy.train_global_batch_size: must be a multiple of the data-parallel size 4 (got 6)"]


def test_checkpoint_metric_must_be_one_the_algorithm_records():
    found = problems(SFTMasterConfig, {"checkpointing": {"metric_name": "val:accuracy"}})
    assert len(found) == 1 and "sft records no 'val:accuracy'; choose one of ['val:val_loss'," in found[0]
    rm_metric = {
        "checkpointing": {"metric_name": "train:reward_margin"},
        "policy": {"reward_model_cfg": {"enabled": True}},
    }
    validate_config(with_base(rm_metric), RMMasterConfig)  # a train metric is fine at any save period


def test_top_k_by_a_validation_metric_at_any_save_period():
    """NeMo-RL's SFT recipes save every 100 steps and validate every 500: accepted; checkpoints saved without the
    metric rank last for keep_top_k (`CheckpointManager.remove_old_checkpoints`, which warns once)."""
    sft_metric = {"metric_name": "val:val_loss", "higher_is_better": False}
    validate_config(
        with_base({"sft": {"val_period": 3}, "checkpointing": {**sft_metric, "save_period": 4}}), SFTMasterConfig
    )


def test_cli_exits_2_on_a_bad_key_before_building_anything(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_algorithm_cli("sft", REPO / "configs" / "sft_smoke.yaml", argv=["sft.max_num_step=3"])
    assert exit_info.value.code == 2
    assert "sft.max_num_step does not exist (did you mean sft.max_num_steps?)" in capsys.readouterr().err


def test_algorithm_metric_names_cover_the_nemo_rl_names():
    assert {"loss", "grad_norm", "lr", "num_valid_samples"} <= set(SFTAlgorithm.train_metric_names)
    assert {
        "loss",
        "sft_loss",
        "preference_loss",
        "accuracy",
        "rewards_chosen_mean",
        "rewards_rejected_mean",
        "reward_margin",
        "grad_norm",
        "lr",
    } <= set(DPOAlgorithm.train_metric_names)
    assert {"loss", "accuracy", "rewards_chosen_mean", "rewards_rejected_mean", "grad_norm", "lr"} <= set(
        RMAlgorithm.train_metric_names
    )
    assert {"loss", "accuracy"} <= set(RMAlgorithm.validation_metric_names)
