"""Reward-model training's config: the ``rm`` section, the whole-run config and the metrics it records."""

from __future__ import annotations

from dataclasses import dataclass, field

from nemo_rl_clone.algorithms.supervised.config import (
    PreferenceAlgorithm,
    SupervisedLoopConfig,
    check_supervised_config,
)
from nemo_rl_clone.data.config import PreferenceDataConfig
from nemo_rl_clone.distributed.virtual_cluster import ClusterConfig
from nemo_rl_clone.models.policy.config import PolicyConfig
from nemo_rl_clone.utils.checkpoint import CheckpointingConfig
from nemo_rl_clone.utils.config_validation import SectionReads, takes_extra_keys
from nemo_rl_clone.utils.logger import LoggerConfig
from nemo_rl_clone.utils.watchdog import WatchdogConfig


@dataclass
class RMConfig(SupervisedLoopConfig):
    """The ``rm`` section: the shared loop keys (NeMo-RL's names and defaults)."""


def _rm_checkpointing() -> CheckpointingConfig:
    return CheckpointingConfig(checkpoint_dir="results/rm", metric_name="val:accuracy", higher_is_better=True)


@takes_extra_keys
@dataclass
class RMMasterConfig(SectionReads):
    """Everything a reward-model run reads; ``policy.reward_model_cfg.enabled`` must be true."""

    rm: RMConfig = field(default_factory=RMConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    data: PreferenceDataConfig = field(default_factory=PreferenceDataConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    checkpointing: CheckpointingConfig = field(default_factory=_rm_checkpointing)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def check(self) -> list[tuple[str, str]]:
        return check_supervised_config(self, RMAlgorithm, reward_model=True)


_RM_METRICS = ("loss", "accuracy", "rewards_chosen_mean", "rewards_rejected_mean", "reward_margin", "num_valid_samples")


class RMAlgorithm(PreferenceAlgorithm):
    section = "rm"
    train_metric_names = (*_RM_METRICS, "grad_norm", "lr")
    validation_metric_names = _RM_METRICS
