"""DPO's run: setup (tokenizer, preference pairs, policy with a frozen reference; resume) and training through the
shared `supervised.loop`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_rl_clone.algorithms.dpo.config import DPOAlgorithm, DPOMasterConfig
from nemo_rl_clone.algorithms.interfaces import Algorithm
from nemo_rl_clone.algorithms.loss.registry import build_loss
from nemo_rl_clone.algorithms.run.state import RunState
from nemo_rl_clone.algorithms.supervised.loop import supervised_train
from nemo_rl_clone.algorithms.supervised.setup import SupervisedRun, build_preference_run, preference_datasets
from nemo_rl_clone.utils.config_validation import as_config


def setup(config: DPOMasterConfig | Mapping[str, Any]) -> SupervisedRun:
    """Tokenizer, preference data, logger, policy with a frozen reference; resumes from the latest checkpoint."""
    config = as_config(config, DPOMasterConfig)  # NeMo-RL passes its master config as a dict
    return build_preference_run(config, DPOAlgorithm(build_loss(None, "dpo", config.dpo.loss_config())))


def dpo_train(run: SupervisedRun) -> None:
    supervised_train(run)


class DPO(Algorithm):
    name = "dpo"
    config_class = DPOMasterConfig

    def setup(self, config: DPOMasterConfig) -> SupervisedRun:
        return setup(config)

    def train(self, run: SupervisedRun) -> None:
        supervised_train(run)

    def datasets(self, config: DPOMasterConfig, tokenizer: Any) -> tuple[Any, Any, int | None]:
        train, validation = preference_datasets(config, "dpo", tokenizer)
        return train, validation, config.data.max_input_seq_length

    def needs_reference_model(self, config: DPOMasterConfig) -> bool:
        return True  # the loss reads the frozen initial policy's logprobs


ALGORITHM = DPO()


# NeMo-RL's names: `from nemo_rl_clone.algorithms.dpo import MasterConfig, setup, dpo_train`.
MasterConfig = DPOMasterConfig
DPOSaveState = RunState
