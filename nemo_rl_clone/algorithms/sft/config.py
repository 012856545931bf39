"""SFT's config: the ``sft`` section, the whole-run config and the metrics it records (what the checks read)."""

from __future__ import annotations

from dataclasses import dataclass, field

from nemo_rl_clone.algorithms.supervised.config import (
    SupervisedAlgorithm,
    SupervisedLoopConfig,
    check_supervised_config,
)
from nemo_rl_clone.data.config import SFTDataConfig
from nemo_rl_clone.distributed.virtual_cluster import ClusterConfig
from nemo_rl_clone.models.policy.config import PolicyConfig
from nemo_rl_clone.utils.checkpoint import CheckpointingConfig
from nemo_rl_clone.utils.config_validation import SectionReads, takes_extra_keys
from nemo_rl_clone.utils.logger import LoggerConfig
from nemo_rl_clone.utils.watchdog import WatchdogConfig


@dataclass
class SFTConfig(SupervisedLoopConfig):
    """The ``sft`` section: the shared loop keys (NeMo-RL's names and defaults)."""

    only_unmask_final: bool = False  # train on the final assistant turn only: refused (every assistant turn trains)

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


@takes_extra_keys
@dataclass
class SFTMasterConfig(SectionReads):
    """Everything an SFT run reads; ``policy.train_global_batch_size`` counts conversations."""

    sft: SFTConfig = field(default_factory=SFTConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    checkpointing: CheckpointingConfig = field(default_factory=_sft_checkpointing)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
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
