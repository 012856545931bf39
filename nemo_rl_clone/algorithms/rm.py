"""Reward-model training: a scalar-head model (``policy.reward_model_cfg.enabled``) fitted Bradley-Terry
(`PreferenceLossFn`) on preference pairs, through the shared `supervised.loop`.

    setup(config) -> SupervisedRun;  rm_train(run)

Batch sizes count pairs, as in DPO (``policy.train_global_batch_size: 8`` = 16 rows). Metrics: ``train/{loss,
accuracy, rewards_chosen_mean, rewards_rejected_mean, reward_margin, grad_norm, lr, num_valid_samples}`` (rewards are
the head's scores), ``validation/{loss, accuracy, ...}`` (accuracy = fraction of validation pairs scored chosen >
rejected), ``timing/train/*``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nemo_rl_clone.algorithms.interfaces import Algorithm
from nemo_rl_clone.algorithms.loss import PreferenceLossFn
from nemo_rl_clone.algorithms.run.state import RunState
from nemo_rl_clone.algorithms.supervised.config import (
    PreferenceAlgorithm,
    SupervisedLoopConfig,
    check_supervised_config,
)
from nemo_rl_clone.algorithms.supervised.loop import supervised_train
from nemo_rl_clone.algorithms.supervised.setup import SupervisedRun, build_preference_run, preference_datasets
from nemo_rl_clone.data.config import PreferenceDataConfig
from nemo_rl_clone.distributed.virtual_cluster import ClusterConfig
from nemo_rl_clone.models.policy.config import PolicyConfig
from nemo_rl_clone.utils.checkpoint import CheckpointingConfig
from nemo_rl_clone.utils.config_validation import as_config
from nemo_rl_clone.utils.logger import LoggerConfig


@dataclass
class RMConfig(SupervisedLoopConfig):
    """The ``rm`` section: the shared loop keys (NeMo-RL's names and defaults)."""


def _rm_checkpointing() -> CheckpointingConfig:
    return CheckpointingConfig(checkpoint_dir="results/rm", metric_name="val:accuracy", higher_is_better=True)


@dataclass
class RMMasterConfig:
    """Everything a reward-model run reads; ``policy.reward_model_cfg.enabled`` must be true."""

    rm: RMConfig = field(default_factory=RMConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    data: PreferenceDataConfig = field(default_factory=PreferenceDataConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    checkpointing: CheckpointingConfig = field(default_factory=_rm_checkpointing)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def check(self) -> list[tuple[str, str]]:
        return check_supervised_config(self, RMAlgorithm, reward_model=True)


_RM_METRICS = ("loss", "accuracy", "rewards_chosen_mean", "rewards_rejected_mean", "reward_margin", "num_valid_samples")


class RMAlgorithm(PreferenceAlgorithm):
    section = "rm"
    train_metric_names = (*_RM_METRICS, "grad_norm", "lr")
    validation_metric_names = _RM_METRICS


def setup(config: RMMasterConfig | Mapping[str, Any]) -> SupervisedRun:
    """Tokenizer, preference data, logger, reward model; resumes from the latest checkpoint."""
    config = as_config(config, RMMasterConfig)  # NeMo-RL passes its master config as a dict
    return build_preference_run(config, RMAlgorithm(PreferenceLossFn()))


def rm_train(run: SupervisedRun) -> None:
    supervised_train(run)


class RM(Algorithm):
    name = "rm"
    config_class = RMMasterConfig

    def setup(self, config: RMMasterConfig) -> SupervisedRun:
        return setup(config)

    def train(self, run: SupervisedRun) -> None:
        supervised_train(run)

    def datasets(self, config: RMMasterConfig, tokenizer: Any) -> tuple[Any, Any, int | None]:
        train, validation = preference_datasets(config, "rm", tokenizer)
        return train, validation, config.data.max_input_seq_length


ALGORITHM = RM()


# NeMo-RL's names: `from nemo_rl_clone.algorithms.rm import MasterConfig, setup, rm_train`.
MasterConfig = RMMasterConfig
RMSaveState = RunState
