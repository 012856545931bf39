"""SFT's run: setup (tokenizer, datasets, policy; resume) and training through the shared `supervised.loop`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_rl_clone.algorithms.interfaces import Algorithm
from nemo_rl_clone.algorithms.loss.registry import build_loss
from nemo_rl_clone.algorithms.run.state import RunState
from nemo_rl_clone.algorithms.sft.config import SFTAlgorithm, SFTMasterConfig
from nemo_rl_clone.algorithms.supervised.loop import supervised_train
from nemo_rl_clone.algorithms.supervised.nemo_rl_api import SupervisedEntry, setup_parts, train_parts
from nemo_rl_clone.algorithms.supervised.setup import SupervisedRun, build_supervised_run, padded_collate
from nemo_rl_clone.utils.config_validation import as_config


def setup(
    master_config: SFTMasterConfig | Mapping[str, Any],
    tokenizer: Any = None,
    train_dataset: Any = None,
    val_dataset: Any = None,
) -> Any:
    """Tokenizer, datasets, logger, policy; resumes from ``checkpointing.checkpoint_dir`` if it holds a
    checkpoint. NeMo-RL's form (a ``tokenizer`` and the ``train_dataset`` given): the run's parts as NeMo-RL's 9-tuple
    (`supervised.nemo_rl_api.setup_parts`)."""
    if tokenizer is not None or train_dataset is not None:
        return setup_parts(SFT_ENTRY, master_config, tokenizer, train_dataset, val_dataset)
    config = as_config(master_config, SFTMasterConfig)  # NeMo-RL passes its master config as a dict
    from nemo_rl_clone.data.supervised import sft_collate_fn

    tokenizer = config.policy.tokenizer.load(config.policy.model_name)
    train, val = sft_datasets(config, tokenizer)
    collate = padded_collate(sft_collate_fn, config, tokenizer)
    return build_supervised_run(config, SFTAlgorithm(_loss(config)), tokenizer, train, val, collate)


def sft_train(
    policy: Any,
    train_dataloader: Any = None,
    val_dataloader: Any = None,
    tokenizer: Any = None,
    loss_fn: Any = None,
    master_config: Any = None,
    logger: Any = None,
    checkpointer: Any = None,
    sft_save_state: Any = None,
) -> None:
    """Train until ``sft.max_num_steps``, ``max_num_epochs`` or ``checkpointing.checkpoint_must_save_by``. NeMo-RL's
    form: the parts `setup` returned (its nine arguments); this library's: one argument, the run ``setup(config)``
    built."""
    parts = (train_dataloader, val_dataloader, tokenizer, loss_fn, master_config, logger, checkpointer, sft_save_state)
    train_parts(SFT_ENTRY, policy, *parts)


def _loss(config: SFTMasterConfig) -> Any:
    return build_loss(None, "nll")


SFT_ENTRY = SupervisedEntry(SFTMasterConfig, SFTAlgorithm, _loss)


class SFT(Algorithm):
    name = "sft"
    config_class = SFTMasterConfig

    def setup(self, config: SFTMasterConfig) -> SupervisedRun:
        return setup(config)

    def train(self, run: SupervisedRun) -> None:
        supervised_train(run)

    def datasets(self, config: SFTMasterConfig, tokenizer: Any) -> tuple[Any, Any, int | None]:
        train, validation = sft_datasets(config, tokenizer)
        return train, validation, config.data.max_input_seq_length


ALGORITHM = SFT()


# NeMo-RL's names: `from nemo_rl_clone.algorithms.sft import MasterConfig, setup, sft_train`.
MasterConfig = SFTMasterConfig
SFTSaveState = RunState


def sft_datasets(config: SFTMasterConfig, tokenizer: Any) -> tuple[Any, Any]:
    """(train, validation) SFT datasets as a run trains on them (the dry run templates their first rows too)."""
    from nemo_rl_clone.data.supervised import SFTDataset, build_datasets, load_sft_dataset

    loaded = load_sft_dataset(config.data, seed=config.data.split_seed(config.sft.seed))
    return build_datasets(
        SFTDataset,
        loaded,
        tokenizer,
        config.data,
        add_bos=config.data.add_bos,
        add_eos=config.data.add_eos,
        add_generation_prompt=config.data.add_generation_prompt,
    )
