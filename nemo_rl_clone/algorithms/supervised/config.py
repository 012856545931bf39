"""The shared pieces SFT, DPO and reward-model training declare: the loop's config section, the algorithm interface
(`SupervisedAlgorithm`, `PreferenceAlgorithm`) and the cross-section checks of their whole-run configs.

Batch sizes in these configs count *examples*: conversations for SFT, preference pairs for DPO and RM (NeMo-RL's
convention). A pair fills two batch rows (chosen, then rejected), so the policy is handed ``rows_per_example`` times
as many rows as the config's batch sizes say.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from nemo_rl_clone.contract.loss import LossFunction
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.models.generation.config import GenerationConfig
from nemo_rl_clone.models.policy.config import ROUTER_REPLAY_GRPO_ONLY
from nemo_rl_clone.utils.checkpoint import CheckpointingConfig
from nemo_rl_clone.utils.config_validation import SectionReads, check_at_least
from nemo_rl_clone.utils.logger import check_no_samples_to_print


@dataclass
class SupervisedLoopConfig(SectionReads):
    """Keys shared by the ``sft``, ``dpo`` and ``rm`` sections (NeMo-RL's names and defaults).

    ``max_num_steps`` -1 sets no step limit (``max_num_epochs`` ends the run); ``val_period`` 0 (or negative,
    NeMo-RL's -1) disables periodic validation; ``val_batches`` <= 0 (NeMo-RL writes -1) validates on every full batch of the validation set;
    ``val_at_end`` validates after the last step unless that step was just validated;
    ``val_global_batch_size`` / ``val_micro_batch_size`` count examples like the training sizes.
    """

    max_num_epochs: int = 1
    max_num_steps: int = 60
    val_period: int = 10
    val_batches: int = 8
    val_global_batch_size: int = 32
    val_micro_batch_size: int = 1
    val_at_start: bool = True  # validate before the first step
    val_at_end: bool = False
    seed: int = 42  # seeds torch/numpy/random, the data shuffling and the validation hold-out split

    @property
    def step_limit(self) -> float:
        """``max_num_steps``, or infinity for -1."""
        return math.inf if self.max_num_steps == -1 else self.max_num_steps

    def check(self) -> list[tuple[str, str]]:
        problems = check_at_least(self, 1, "max_num_epochs", "val_global_batch_size", "val_micro_batch_size")
        if self.max_num_steps < 1 and self.max_num_steps != -1:
            problems.append(("max_num_steps", f"must be >= 1, or -1 for no limit, got {self.max_num_steps}"))
        return problems


class SupervisedAlgorithm:
    """What differs between SFT, DPO and RM. Subclasses set the class attributes and may override the hooks.

    ``share_metrics`` are loss metrics returned as each microbatch's share of a global mean (summed over
    microbatches); ``count_metrics`` are summed counts. ``train_metric_names`` / ``validation_metric_names`` list
    what `train_metrics` / `validation_metrics` return (checked against ``checkpointing.metric_name``).
    """

    section: ClassVar[str]
    rows_per_example: ClassVar[int] = 1
    share_metrics: ClassVar[tuple[str, ...]] = ("loss",)
    count_metrics: ClassVar[tuple[str, ...]] = ("num_valid_samples",)
    train_metric_names: ClassVar[tuple[str, ...]]
    validation_metric_names: ClassVar[tuple[str, ...]]
    needs_reference_model: ClassVar[bool] = False

    def __init__(self, loss_fn: LossFunction) -> None:
        self.loss_fn = loss_fn

    def prepare_batch(self, batch: BatchedDataDict, policy: Any, micro_batch_rows: int) -> BatchedDataDict:
        """The batch ``policy.train`` receives (default: as collated)."""
        return batch

    def train_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """``train/*`` metrics from the reduced step metrics (default: unchanged)."""
        return metrics

    def validation_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """``validation/*`` metrics from the combined validation metrics (default: unchanged)."""
        return metrics


class PreferenceAlgorithm(SupervisedAlgorithm):
    """DPO and reward models: an example is a pair, collated as rows 2i (chosen) and 2i+1 (rejected).

    Adds ``reward_margin`` = ``rewards_chosen_mean − rewards_rejected_mean`` to the loss's metrics.
    """

    rows_per_example = 2
    share_metrics: ClassVar[tuple[str, ...]] = ("loss", "accuracy", "rewards_chosen_mean", "rewards_rejected_mean")

    def train_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        return {**metrics, "reward_margin": metrics["rewards_chosen_mean"] - metrics["rewards_rejected_mean"]}

    def validation_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        return self.train_metrics(metrics)


def check_supervised_config(
    config: Any, algorithm: type[SupervisedAlgorithm], reward_model: bool = False
) -> list[tuple[str, str]]:
    """Cross-section problems of an SFT/DPO/RM config as ``(dotted key, message)``."""
    section = algorithm.section
    loop: SupervisedLoopConfig = getattr(config, section)
    policy, checkpointing = config.policy, config.checkpointing
    problems: list[tuple[str, str]] = []
    if config.data.max_input_seq_length > policy.max_total_sequence_length:
        problems.append(
            (
                "data.max_input_seq_length",
                f"exceeds policy.max_total_sequence_length ({config.data.max_input_seq_length} > "
                f"{policy.max_total_sequence_length})",
            )
        )
    if policy.reward_model_cfg.enabled != reward_model:
        want = "true: reward-model training needs a scalar head" if reward_model else f"false for {section}"
        problems.append(("policy.reward_model_cfg.enabled", f"must be {want}"))
    elif reward_model and policy.reward_model_cfg.reward_model_type != "bradley_terry":
        problems.append(
            (
                "policy.reward_model_cfg.reward_model_type",
                "must be bradley_terry for reward-model training (regression is a PPO critic's per-token head)",
            )
        )
    workers = config.cluster.gpus_per_node * config.cluster.num_nodes
    model_parallel = policy.model_parallel_size()
    dp = workers // model_parallel if model_parallel >= 1 and workers % model_parallel == 0 else 1
    for key, size in (
        ("policy.train_global_batch_size", policy.train_global_batch_size),
        (f"{section}.val_global_batch_size", loop.val_global_batch_size),
    ):
        if size % dp:
            problems.append((key, f"must be a multiple of the data-parallel size {dp} (got {size})"))
    if algorithm.rows_per_example > 1 and policy.dynamic_batching.enabled:
        problems.append(
            (
                "policy.dynamic_batching.enabled",
                f"{section} needs the chosen and rejected rows of a pair side by side; reordering rows by length would "
                "split them (policy.sequence_packing keeps pairs whole)",
            )
        )
    if policy.generation not in (None, GenerationConfig()):
        problems.append(("policy.generation", f"{section} generates nothing; set it to null"))
    if policy.router_replay.enabled:
        problems.append(("policy.router_replay.enabled", ROUTER_REPLAY_GRPO_ONLY))
    problems += check_no_samples_to_print(config.logger, section)
    problems += _check_checkpoint_metric(checkpointing, algorithm)
    return problems


def _check_checkpoint_metric(
    checkpointing: CheckpointingConfig, algorithm: type[SupervisedAlgorithm]
) -> list[tuple[str, str]]:
    """``checkpointing.metric_name`` must name a metric this algorithm records."""
    if checkpointing.metric_name is None or ":" not in checkpointing.metric_name:
        return []  # absent, or malformed (CheckpointingConfig.check reports that)
    prefix, _, name = checkpointing.metric_name.partition(":")
    known = {"val": algorithm.validation_metric_names, "train": algorithm.train_metric_names}
    if name not in known.get(prefix, ()):
        options = [f"{p}:{n}" for p, names in known.items() for n in names]
        return [
            (
                "checkpointing.metric_name",
                f"{algorithm.section} records no {checkpointing.metric_name!r}; choose one of {options}",
            )
        ]
    # A checkpoint saved at a step without validation lacks the metric: keep_top_k ranks it last and says so once
    # (NeMo-RL accepts such periods too; its recipes save every 100 steps and validate every 500).
    return []
