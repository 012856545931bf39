"""Step metrics every rollout-based algorithm reduces the same way: a `Policy.train` result's metrics, several
batches' metrics combined, and which prompt groups carry a learning signal."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

# Share metrics the policy itself adds, whatever the loss: the MoE routers' load-balancing loss (DTensor backend).
POLICY_SHARE_METRICS = ("router_aux_loss",)


def reduce_train_results(
    train_results: Mapping[str, Any], share_metrics: Iterable[str], count_metrics: Iterable[str] = ()
) -> dict[str, float]:
    """One step's metrics from ``Policy.train``'s result (``all_mb_metrics``: metric → one value per microbatch).

    A loss returns each microbatch's *share* of its global batch's mean (see `loss_functions`), so a share metric
    is the sum over microbatches divided by ``num_global_batches`` (the mean over the step's optimizer steps); a
    count metric (``num_valid_samples``, ...) is the plain sum. Adds ``grad_norm`` (mean over optimizer steps) and
    ``lr`` (the last microbatch's) when present, and ``num_trained_samples`` when the policy left rows out. Metrics
    missing from ``all_mb_metrics`` are left out.
    """
    num_global_batches = max(1, int(train_results.get("num_global_batches", 1)))
    # With rows left out (`trained_rows`), a global batch that ran only masked rows reports only its loss.
    num_trained = max(1, int(train_results.get("num_global_batches_with_metrics", num_global_batches)))
    mb = train_results["all_mb_metrics"]
    metrics = {
        name: float(sum(mb[name])) / (num_global_batches if name == "loss" else num_trained)
        for name in (*share_metrics, *POLICY_SHARE_METRICS)
        if name in mb
    }
    metrics.update({name: float(sum(mb[name])) for name in count_metrics if name in mb})
    metrics["grad_norm"] = float(torch.as_tensor(train_results["grad_norm"], dtype=torch.float32).mean())
    if "lr" in mb:
        metrics["lr"] = float(mb["lr"][-1])
    if "num_trained_samples" in train_results:
        metrics["num_trained_samples"] = float(train_results["num_trained_samples"])
    return metrics


def combine_batches(
    per_batch: Sequence[Mapping[str, float]],
    share_metrics: Iterable[str],
    count_metrics: Iterable[str],
    weights: Sequence[float] | None = None,
) -> dict[str, float]:
    """Metrics of several batches combined: share metrics averaged weighted by ``weights`` (default: each batch's
    ``num_valid_samples``), counts summed. Metrics some batch lacks are left out.

    Batches of weight 0 do not count (if all weigh 0, share metrics are a plain mean).
    """
    if weights is None:
        weights = [float(m.get("num_valid_samples", 1.0)) for m in per_batch]
    total = float(sum(weights))
    if total <= 0:
        weights, total = [1.0] * len(per_batch), float(len(per_batch))
    combined = {
        name: sum(w * m[name] for w, m in zip(weights, per_batch, strict=True)) / total
        for name in share_metrics
        if all(name in m for m in per_batch)
    }
    combined.update(
        {name: float(sum(m[name] for m in per_batch)) for name in count_metrics if all(name in m for m in per_batch)}
    )
    return combined


def groups_with_signal(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """[B // group_size] bool: groups whose rewards are not all equal (dynamic sampling keeps only these)."""
    groups = rewards.view(-1, group_size)
    return (groups != groups[:, :1]).any(dim=1)
