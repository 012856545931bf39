"""Reward-model training's run: setup (tokenizer, preference pairs, scalar-head model; resume) and training through
the shared `supervised.loop`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_rl_clone.algorithms.interfaces import Algorithm
from nemo_rl_clone.algorithms.loss.registry import build_loss
from nemo_rl_clone.algorithms.rm.config import RMAlgorithm, RMMasterConfig
from nemo_rl_clone.algorithms.run.state import RunState
from nemo_rl_clone.algorithms.supervised.loop import supervised_train
from nemo_rl_clone.algorithms.supervised.setup import SupervisedRun, build_preference_run, preference_datasets
from nemo_rl_clone.utils.config_validation import as_config


def setup(config: RMMasterConfig | Mapping[str, Any]) -> SupervisedRun:
    """Tokenizer, preference data, logger, reward model; resumes from the latest checkpoint."""
    config = as_config(config, RMMasterConfig)  # NeMo-RL passes its master config as a dict
    return build_preference_run(config, RMAlgorithm(build_loss(None, "preference")))


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
