"""SFT's, DPO's and RM's validation in NeMo-RL v0.7.0's form (``validate``, ``validate_one_dataset``,
``add_ref_logprobs_to_data``), on the metrics this library's supervised loop computes.

NeMo-RL's functions take the run's parts (policy, a dataloader — for DPO and RM a dict of named dataloaders —, the
loss, the master config) instead of this library's `SupervisedRun`. Each batch goes through the algorithm's
`prepare_batch` (DPO: the reference policy's logprobs, in this library's layout, which its DPO loss reads) and one
eval-mode ``policy.train`` call; a short last batch is padded with masked rows (`maybe_pad_last_batch`). Batches
combine as in NeMo-RL: weighted by their valid tokens (SFT) or valid samples (DPO, RM).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from nemo_rl_clone.algorithms.supervised.config import SupervisedAlgorithm
from nemo_rl_clone.algorithms.supervised.loop import step_metrics
from nemo_rl_clone.algorithms.utils import combine_batches, maybe_pad_last_batch
from nemo_rl_clone.utils.timer import Timer

log = logging.getLogger(__name__)
TOTAL_TIME = "total_validation_time"


def config_value(config: Any, *path: str) -> Any:
    """``config[path[0]][path[1]]...``: sections and keys read as attributes or mapping keys (NeMo-RL's master
    config is a model whose sections are dicts)."""
    for key in path:
        config = config[key] if isinstance(config, Mapping) else getattr(config, key)
    return config


def data_parallel_size(policy: Any) -> int:
    """How many data-parallel ranks ``policy`` trains on (NeMo-RL reads it from the sharding annotations)."""
    sharding = getattr(policy, "sharding_annotations", None)
    if sharding is not None:
        return int(sharding.get_axis_size("data_parallel"))
    return int(policy.worker_group.dp_size)


def prepared_batches(
    algorithm: SupervisedAlgorithm, batches: Iterable[Any], policy: Any, micro_batch_rows: int, pad: bool
) -> Iterator[Any]:
    """Each of ``batches`` through the algorithm's `prepare_batch`; with ``pad``, a short batch is first padded to a
    multiple of ``micro_batch_rows`` × the data-parallel size (validation runs every example, NeMo-RL's rule)."""
    for batch in batches:
        if pad:
            batch = maybe_pad_last_batch(batch, data_parallel_size(policy), micro_batch_rows)
        yield algorithm.prepare_batch(batch, policy, micro_batch_rows)


def _valid_counts(batch: Any) -> dict[str, float]:
    """NeMo-RL's ``global_valid_seqs`` / ``global_valid_toks`` of one batch: Σ sample_mask and the masked targets."""
    sample_mask = batch["sample_mask"].float()
    tokens = (batch["token_mask"][:, 1:].float() * sample_mask.unsqueeze(-1)).sum()
    return {"global_valid_seqs": float(sample_mask.sum()), "global_valid_toks": float(tokens)}


def evaluate(
    algorithm: SupervisedAlgorithm,
    policy: Any,
    val_dataloader: Iterable[Any],
    val_batches: int,
    val_mbs: int,
    weight: str,
) -> dict[str, float]:
    """The combined eval-mode metrics of the first ``val_batches`` batches (all when ≤ 0), each batch weighted by its
    ``weight`` metric; {} when no batch had a valid sample. ``val_mbs`` counts examples (a pair is two rows)."""
    rows = algorithm.rows_per_example * val_mbs
    per_batch = []
    policy.prepare_for_training()
    for index, batch in enumerate(prepared_batches(algorithm, val_dataloader, policy, rows, pad=True)):
        results = policy.train(batch, algorithm.loss_fn, eval_mode=True, gbs=batch.size, mbs=rows)
        if results["all_mb_metrics"]:
            per_batch.append({**step_metrics(algorithm, results), **_valid_counts(batch)})
        if val_batches > 0 and index >= val_batches - 1:
            break
    if not per_batch:
        log.warning("no validation metrics were collected: the validation batches hold no valid sample")
        return {}
    counts = (*algorithm.count_metrics, "global_valid_seqs", "global_valid_toks")
    weights = [batch.get(weight, 0.0) for batch in per_batch]
    return combine_batches(per_batch, algorithm.share_metrics, counts, weights)


def sft_validate(
    algorithm: SupervisedAlgorithm, policy: Any, val_dataloader: Any, val_batches: int, val_mbs: int
) -> tuple[dict[str, float], dict[str, float]]:
    """NeMo-RL's SFT ``validate``: ``({"val_loss": token-weighted mean loss}, {"total_validation_time": s})``;
    ``({}, {})`` without a validation dataloader."""
    if val_dataloader is None:
        return {}, {}
    timer = Timer()
    with timer.time(TOTAL_TIME):
        metrics = evaluate(algorithm, policy, val_dataloader, val_batches, val_mbs, weight="global_valid_toks")
    val_metrics = {"val_loss": metrics["loss"]} if metrics else {"val_loss": 0.0}
    return val_metrics, timer.get_timing_metrics(reduction_op="sum")


def preference_validation(algorithm_class: Any, metrics_class: type) -> tuple[Any, Any]:
    """DPO's and RM's ``validate_one_dataset`` and ``validate`` with NeMo-RL's parameters, for their
    ``algorithm_class`` (built on the caller's loss) and ``metrics_class`` (a dataclass of metric fields)."""

    def validate_one_dataset(
        policy: Any,
        val_dataloader: Any,
        loss_fn: Any,
        step: int,
        master_config: Any,
        val_batches: int,
        val_batch_size: int,
        val_mbs: int,
        dataset_name: str,
    ) -> tuple[Any, dict[str, float]] | None:
        """``(metrics, {"total_validation_time": s})`` of one validation set (None without a dataloader): its first
        ``val_batches`` batches (all when ≤ 0) in eval mode, ``val_mbs`` pairs per micro-batch, the metrics
        sample-weighted means over the batches (every field 0 when no batch had a valid sample)."""
        if val_dataloader is None:
            return None
        timer = Timer()
        with timer.time(TOTAL_TIME):
            algorithm = algorithm_class(loss_fn)
            metrics = evaluate(algorithm, policy, val_dataloader, val_batches, val_mbs, weight="num_valid_samples")
        values = {field.name: float(metrics.get(field.name, 0.0)) for field in dataclasses.fields(metrics_class)}
        return metrics_class(**values), timer.get_timing_metrics(reduction_op="sum")

    def validate(
        policy: Any,
        val_dataloader: Any,
        tokenizer: Any,
        loss_fn: Any,
        step: int,
        master_config: Any,
        val_batches: int,
        val_batch_size: int,
        val_mbs: int,
        logger: Any,
    ) -> tuple[dict[str, float], dict[str, float]]:
        """Every named validation set of ``val_dataloader`` (a dict, or one dataloader named ``validation``), each
        logged under ``validation-<name>``: NeMo-RL's flat ``{"validation-<name>_<metric>": value}`` and timings
        with their ``total_validation_time``."""
        loaders = val_dataloader if isinstance(val_dataloader, Mapping) else {"validation": val_dataloader}
        val_metrics: dict[str, float] = {}
        timings: dict[str, float] = {}
        for name, loader in loaders.items():
            parts = (step, master_config, val_batches, val_batch_size, val_mbs, name)
            result = validate_one_dataset(policy, loader, loss_fn, *parts)
            if result is None:
                continue
            metrics, timing = result
            prefix = f"validation-{name}"
            logger.log_metrics(dataclasses.asdict(metrics), step, prefix=prefix)
            logger.log_metrics(timing, step, prefix=f"timing/{prefix}")
            val_metrics.update({f"{prefix}_{key}": value for key, value in dataclasses.asdict(metrics).items()})
            timings[f"{prefix}_{TOTAL_TIME}"] = timing[TOTAL_TIME]
        if timings:
            timings[TOTAL_TIME] = sum(timings.values())
            logger.log_metrics({TOTAL_TIME: timings[TOTAL_TIME]}, step, prefix="timing/validation")
        return val_metrics, timings

    return validate_one_dataset, validate
