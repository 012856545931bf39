"""Supervised fine-tuning: NLL on the assistant tokens of chat rows, through the shared `supervised.loop`.

    setup(config) -> SupervisedRun;  sft_train(run)

Metrics: ``train/{loss, grad_norm, lr, num_valid_samples, num_unmasked_tokens}``, ``validation/val_loss``,
``timing/train/*``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from nemo_rl_clone.algorithms.interfaces import Algorithm
from nemo_rl_clone.algorithms.loss import NLLLossFn
from nemo_rl_clone.algorithms.run.state import RunState
from nemo_rl_clone.algorithms.supervised.config import (
    SupervisedAlgorithm,
    SupervisedLoopConfig,
    check_supervised_config,
)
from nemo_rl_clone.algorithms.supervised.loop import supervised_train
from nemo_rl_clone.algorithms.supervised.setup import SupervisedRun, build_supervised_run
from nemo_rl_clone.data.config import SFTDataConfig
from nemo_rl_clone.distributed.virtual_cluster import ClusterConfig
from nemo_rl_clone.models.policy.config import PolicyConfig
from nemo_rl_clone.utils.checkpoint import CheckpointingConfig
from nemo_rl_clone.utils.config_validation import as_config
from nemo_rl_clone.utils.logger import LoggerConfig


@dataclass
class SFTConfig(SupervisedLoopConfig):
    """The ``sft`` section: the shared loop keys (NeMo-RL's names and defaults)."""

    only_unmask_final: bool = False

    def check(self) -> list[tuple[str, str]]:
        problems = super().check()
        if self.only_unmask_final:
            problems.append(
                (
                    "only_unmask_final",
                    "not supported yet: training on the final assistant turn only; every assistant turn trains, "
                    "set it to false",
                )
            )
        return problems


def _sft_checkpointing() -> CheckpointingConfig:
    return CheckpointingConfig(checkpoint_dir="results/sft", metric_name="val:val_loss", higher_is_better=False)


@dataclass
class SFTMasterConfig:
    """Everything an SFT run reads; ``policy.train_global_batch_size`` counts conversations."""

    sft: SFTConfig = field(default_factory=SFTConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    checkpointing: CheckpointingConfig = field(default_factory=_sft_checkpointing)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def check(self) -> list[tuple[str, str]]:
        return check_supervised_config(self, SFTAlgorithm)


class SFTAlgorithm(SupervisedAlgorithm):
    section = "sft"
    count_metrics = ("num_valid_samples", "num_unmasked_tokens")
    train_metric_names = ("loss", "grad_norm", "lr", "num_valid_samples", "num_unmasked_tokens")
    validation_metric_names = ("val_loss", "num_valid_samples", "num_unmasked_tokens")

    def validation_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """NeMo-RL names the validation loss ``val_loss`` (``validation/val_loss``)."""
        renamed = dict(metrics)
        renamed["val_loss"] = renamed.pop("loss")
        return renamed


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
    return build_supervised_run(config, SFTAlgorithm(NLLLossFn()), tokenizer, train, val, collate)


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
