"""SFT's run: setup (tokenizer, datasets, policy; resume) and training through the shared `supervised.loop`."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from nemo_rl_clone.algorithms.interfaces import Algorithm
from nemo_rl_clone.algorithms.loss.registry import build_loss
from nemo_rl_clone.algorithms.run.state import RunState
from nemo_rl_clone.algorithms.sft.config import SFTAlgorithm, SFTMasterConfig
from nemo_rl_clone.algorithms.supervised.loop import supervised_train
from nemo_rl_clone.algorithms.supervised.setup import SupervisedRun, build_supervised_run
from nemo_rl_clone.utils.config_validation import as_config


def setup(config: SFTMasterConfig | Mapping[str, Any]) -> SupervisedRun:
    """Tokenizer, datasets, logger, policy; resumes from ``checkpointing.checkpoint_dir`` if it holds a checkpoint."""
    config = as_config(config, SFTMasterConfig)  # NeMo-RL passes its master config as a dict
    from nemo_rl_clone.data.supervised import sft_collate_fn

    tokenizer = config.policy.tokenizer.load(config.policy.model_name)
    train, val = sft_datasets(config, tokenizer)
    collate = partial(
        sft_collate_fn,
        pad_token_id=tokenizer.pad_token_id,
        make_sequence_length_divisible_by=config.policy.make_sequence_length_divisible_by,
    )
    return build_supervised_run(config, SFTAlgorithm(build_loss(None, "nll")), tokenizer, train, val, collate)


def sft_train(run: SupervisedRun) -> None:
    supervised_train(run)


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
