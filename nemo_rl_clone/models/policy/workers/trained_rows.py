"""Leaving rows without a gradient out of a training pass, exactly.

A loss may declare ``rows_with_gradient(data) -> [B] bool | None`` (`ClippedPGLossFn` does: in GRPO a prompt group
whose rewards are all equal has advantage 0 on every token, and without a KL term its samples add exactly 0 to the
loss and the gradient). `Policy.train` then runs only those rows of each global batch, and the workers divide by
the *whole* global batch's counts (`StepNormalization` in `train_step`), so the optimizer sees the gradient of the
whole batch up to summation order. Skipped rows still count everywhere outside the training pass (rewards,
advantages, logged samples, the batch's metrics).

A router load-balancing loss (an MoE policy's ``router_aux_loss_coef`` or ``moe_aux_loss_coeff`` > 0) is a
function of every row that runs, whatever its advantage: leaving rows out would change its gradient, so with one
every row trains (``router_aux_loss``).

Every global batch must keep the same number of rows, a multiple of the data-parallel size (each rank runs one
share per optimizer step), so batches with fewer rows with a gradient are topped up with their shortest other rows
(unmasked first): they add nothing to the gradient either, and the loss's metrics cover them with the rest. A global
batch with no row with a gradient still runs one such row per rank, so its optimizer step happens as it would have
(an exactly-zero gradient; Adam's moments decay) and its metrics describe those rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.distributed.model_utils import valid_counts


@dataclass(frozen=True)
class TrainedRows:
    """The rows a training pass runs and what the workers normalise by.

    ``data``: ``G`` global batches of ``global_batch_size`` rows each, in order. ``normalization``: ``G`` pairs
    (valid sequences, valid tokens) of the whole global batches (`valid_counts`). ``num_rows_with_gradient``: rows
    that carry one (top-up rows not counted); ``num_global_batches_with_metrics``: global batches whose rows include
    an unmasked one (the others report only their loss, see `train_step.StepNormalization`).
    """

    data: BatchedDataDict
    global_batch_size: int
    normalization: list[tuple[float, float]]
    num_rows_with_gradient: int
    num_global_batches_with_metrics: int


def trained_rows_for(
    loss_fn: Any, data: BatchedDataDict, global_batch_size: int, dp_size: int, router_aux_loss: bool
) -> TrainedRows | None:
    """`select_trained_rows` by ``loss_fn``'s ``rows_with_gradient``. None (every row trains): the loss declares
    none, there are none to leave out, or ``router_aux_loss`` (the policy adds a router load-balancing loss)."""
    if router_aux_loss:
        return None
    rows_with_gradient = getattr(loss_fn, "rows_with_gradient", None)
    keep = rows_with_gradient(data) if rows_with_gradient is not None else None
    return select_trained_rows(data, keep, global_batch_size, dp_size) if keep is not None else None


def select_trained_rows(
    data: BatchedDataDict, rows_with_gradient: torch.Tensor, global_batch_size: int, dp_size: int
) -> TrainedRows | None:
    """The rows of ``data`` (``[B]`` rows, ``B`` a multiple of ``global_batch_size``) a training pass needs, or
    None when leaving rows out would save nothing."""
    num_batches = data.size // global_batch_size
    keep = rows_with_gradient.to(torch.bool).cpu().view(num_batches, global_batch_size)
    kept_per_batch = keep.sum(dim=1)
    width = max(int(kept_per_batch.max()), 1)
    width = -(-width // dp_size) * dp_size
    if width >= global_batch_size:
        return None
    lengths = data["input_lengths"] if "input_lengths" in data else data["token_mask"].sum(dim=1)
    # top-ups: unmasked rows first (their metrics then describe something), shortest first (cheapest)
    cost = lengths.double() + (data["sample_mask"] == 0).double() * (lengths.max().item() + 1)
    chosen = []
    for index in range(num_batches):
        rows = torch.arange(index * global_batch_size, (index + 1) * global_batch_size)
        others = rows[~keep[index]]
        others = others[torch.argsort(cost[others], stable=True)][: width - int(kept_per_batch[index])]
        chosen += rows[keep[index]].tolist() + others.tolist()
    selected = data.select_indices(chosen)
    normalization = []
    for index in range(num_batches):
        seqs, toks = valid_counts(data.get_batch(index, global_batch_size))
        normalization.append((float(seqs), float(toks)))
    reporting = selected["sample_mask"].view(num_batches, width).ne(0).any(dim=1)
    return TrainedRows(
        data=selected,
        global_batch_size=width,
        normalization=normalization,
        num_rows_with_gradient=int(kept_per_batch.sum()),
        num_global_batches_with_metrics=int(reporting.sum()),
    )
