"""DPO's config: the ``dpo`` section (the loop's keys and `DPOLossConfig`'s), the whole-run config and the
algorithm's batch preparation and metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nemo_rl_clone.algorithms.loss import DPOLossConfig
from nemo_rl_clone.algorithms.supervised.config import (
    PreferenceAlgorithm,
    SupervisedLoopConfig,
    check_supervised_config,
)
from nemo_rl_clone.data.config import PreferenceDataConfig
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.distributed.virtual_cluster import ClusterConfig
from nemo_rl_clone.models.policy.config import PolicyConfig
from nemo_rl_clone.utils.checkpoint import CheckpointingConfig
from nemo_rl_clone.utils.config_validation import SectionReads, takes_extra_keys
from nemo_rl_clone.utils.logger import LoggerConfig
from nemo_rl_clone.utils.watchdog import WatchdogConfig

_LOSS_KEYS = tuple(DPOLossConfig.__dataclass_fields__)


@dataclass
class DPOConfig(SupervisedLoopConfig):
    """The ``dpo`` section: the shared loop keys plus `DPOLossConfig`'s (β = ``reference_policy_kl_penalty``)."""

    max_num_steps: int = 150
    val_period: int = 25
    reference_policy_kl_penalty: float = 0.05
    preference_average_log_probs: bool = False  # each row's reward is its token mean of lp − lp_ref, not the sum
    sft_average_log_probs: bool = False  # the NLL term is the chosen row's token mean, not the sum
    preference_loss_weight: float = 1.0  # the DPO term's weight
    sft_loss_weight: float = 0.0  # the weight of an NLL term on the chosen responses

    def loss_config(self) -> DPOLossConfig:
        return DPOLossConfig(**{key: getattr(self, key) for key in _LOSS_KEYS})

    def check(self) -> list[tuple[str, str]]:
        return super().check() + self.loss_config().check()


def _dpo_checkpointing() -> CheckpointingConfig:
    return CheckpointingConfig(
        checkpoint_dir="results/dpo", metric_name="val:loss", higher_is_better=False, save_period=50
    )


@takes_extra_keys
@dataclass
class DPOMasterConfig(SectionReads):
    """Everything a DPO run reads; see the module doc for what the batch sizes count."""

    dpo: DPOConfig = field(default_factory=DPOConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    data: PreferenceDataConfig = field(default_factory=PreferenceDataConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    checkpointing: CheckpointingConfig = field(default_factory=_dpo_checkpointing)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def check(self) -> list[tuple[str, str]]:
        return check_supervised_config(self, DPOAlgorithm)


_PREFERENCE_METRICS = (
    "loss",
    "sft_loss",
    "preference_loss",
    "accuracy",
    "rewards_chosen_mean",
    "rewards_rejected_mean",
    "reward_margin",
    "num_valid_samples",
)


class DPOAlgorithm(PreferenceAlgorithm):
    section = "dpo"
    share_metrics = ("loss", "sft_loss", "preference_loss", "accuracy", "rewards_chosen_mean", "rewards_rejected_mean")
    train_metric_names = (*_PREFERENCE_METRICS, "grad_norm", "lr")
    validation_metric_names = _PREFERENCE_METRICS
    needs_reference_model = True

    def prepare_batch(self, batch: BatchedDataDict, policy: Any, micro_batch_rows: int) -> BatchedDataDict:
        """Adds ``reference_policy_logprobs`` [2B, S]: the frozen initial policy's logprobs of every row."""
        reference = policy.get_reference_policy_logprobs(batch, micro_batch_size=micro_batch_rows)
        batch["reference_policy_logprobs"] = reference["reference_logprobs"]
        return batch
