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
from nemo_rl_clone.algorithms.supervised.nemo_rl_api import SupervisedEntry, setup_parts, train_parts
from nemo_rl_clone.algorithms.supervised.setup import SupervisedRun, build_preference_run, preference_datasets
from nemo_rl_clone.utils.config_validation import as_config


def setup(
    master_config: DPOMasterConfig | Mapping[str, Any],
    tokenizer: Any = None,
    train_dataset: Any = None,
    val_dataset: Any = None,
) -> Any:
    """Tokenizer, preference data, logger, policy with a frozen reference; resumes from the latest checkpoint. NeMo-RL's form (a ``tokenizer`` and the ``train_dataset`` given): the run's parts as NeMo-RL's 9-tuple
    (`supervised.nemo_rl_api.setup_parts`)."""
    if tokenizer is not None or train_dataset is not None:
        return setup_parts(DPO_ENTRY, master_config, tokenizer, train_dataset, val_dataset)
    config = as_config(master_config, DPOMasterConfig)  # NeMo-RL passes its master config as a dict
    return build_preference_run(config, DPOAlgorithm(_loss(config)))


def dpo_train(
    policy: Any,
    train_dataloader: Any = None,
    val_dataloader: Any = None,
    tokenizer: Any = None,
    loss_fn: Any = None,
    master_config: Any = None,
    logger: Any = None,
    checkpointer: Any = None,
    dpo_save_state: Any = None,
) -> None:
    """Train until ``dpo.max_num_steps``, ``max_num_epochs`` or ``checkpointing.checkpoint_must_save_by``. NeMo-RL's
    form: the parts `setup` returned (its nine arguments); this library's: one argument, the run ``setup(config)``
    built."""
    parts = (train_dataloader, val_dataloader, tokenizer, loss_fn, master_config, logger, checkpointer, dpo_save_state)
    train_parts(DPO_ENTRY, policy, *parts)


def _loss(config: DPOMasterConfig) -> Any:
    return build_loss(None, "dpo", config.dpo.loss_config())


DPO_ENTRY = SupervisedEntry(DPOMasterConfig, DPOAlgorithm, _loss)


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
