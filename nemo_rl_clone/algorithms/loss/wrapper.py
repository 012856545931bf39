"""NeMo-RL v0.7.0's loss wrappers (``nemo_rl.algorithms.loss.wrapper``): a loss called on logits that still need
their input prepared (`prepare_loss_input`), and on the logits of a packed row ``[1, T, V]`` holding several samples.

Packed logits come back to the samples' padded rows by `PackedRows` (the DTensor worker's sequence packing):
sample i's valid tokens sit at ``cu_seqlens_q_padded[i]`` onward in the packed row, ``cu_seqlens_q[i + 1] −
cu_seqlens_q[i]`` of them. `SequencePackingLossWrapper` then calls the loss once per sample and adds the results up
(each call returns its share of the global mean, so the sum is the microbatch's); `SequencePackingFusionLossWrapper`
unpacks once and calls the loss once. Both give the same numbers. Context parallelism is refused by the losses
(`prepare_loss_input`); ``DraftLossWrapper`` (EAGLE draft models) is refused by name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor as Tensor  # NeMo-RL's module offers it too

from nemo_rl_clone.contract.loss import LossFunction
from nemo_rl_clone.contract.loss_input import prepare_loss_input
from nemo_rl_clone.contract.sampling import TrainingSamplingParams
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.models.policy.workers.packed_sequences import PackedRows
from nemo_rl_clone.utils.unsupported_modules import refusing_getattr

__all__ = [
    "SequencePackingFusionLossWrapper",
    "SequencePackingLossWrapper",
    "Tensor",
    "prepare_packed_loss_input",
    "wrap_loss_fn_with_input_preparation",
]

_LOWEST = ("probs_ratio_min", "probs_ratio_clamped_min")  # NeMo-RL's per-sequence metrics that reduce by min / max
_HIGHEST = ("probs_ratio_max", "probs_ratio_clamped_max")


def _call_loss(
    loss_fn: LossFunction, prepared: tuple[Mapping[str, Any], Any], global_valid_seqs: Any, global_valid_toks: Any
) -> tuple[torch.Tensor, dict[str, Any]]:
    loss_input, data = dict(prepared[0]), prepared[1]
    logits = loss_input.pop("next_token_logits")
    return loss_fn(logits, data, global_valid_seqs, global_valid_toks, **loss_input)


def wrap_loss_fn_with_input_preparation(
    next_token_logits: torch.Tensor,
    data: BatchedDataDict[Any],
    global_valid_seqs: torch.Tensor | None,
    global_valid_toks: torch.Tensor | None,
    loss_fn: LossFunction,
    prepare_fn: Callable[..., Any],
    vocab_parallel_rank: int | None = None,
    vocab_parallel_group: dist.ProcessGroup | None = None,
    context_parallel_group: dist.ProcessGroup | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """``loss_fn`` on what ``prepare_fn`` (`prepare_loss_input`) makes of ``next_token_logits`` ``[B, S, V]``."""
    prepared = prepare_fn(
        logits=next_token_logits,
        data=data,
        loss_fn=loss_fn,
        vocab_parallel_rank=vocab_parallel_rank,
        vocab_parallel_group=vocab_parallel_group,
        context_parallel_group=context_parallel_group,
    )
    return _call_loss(loss_fn, prepared, global_valid_seqs, global_valid_toks)


def _lengths_and_starts(cu_seqlens_q: torch.Tensor, cu_seqlens_q_padded: torch.Tensor | None) -> tuple[list, list]:
    lengths = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).tolist()
    starts = (cu_seqlens_q if cu_seqlens_q_padded is None else cu_seqlens_q_padded)[:-1].tolist()
    return [int(n) for n in lengths], [int(s) for s in starts]


def unpacked_logits(
    packed: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_q_padded: torch.Tensor | None, width: int
) -> torch.Tensor:
    """``[B, width, V]`` rows of the packed logits ``[1, T, V]`` (zeros past each sample's length; differentiable)."""
    lengths, starts = _lengths_and_starts(cu_seqlens_q, cu_seqlens_q_padded)
    positions = [torch.arange(start, start + n, device=packed.device) for start, n in zip(starts, lengths, strict=True)]
    valid = packed[:, torch.cat(positions)] if positions else packed[:, :0]
    return PackedRows(torch.tensor(lengths, device=packed.device), width).unpack(valid)


def prepare_packed_loss_input(
    logits: torch.Tensor,
    data: BatchedDataDict[Any],
    loss_fn: LossFunction,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_q_padded: torch.Tensor,
    vocab_parallel_rank: int | None = None,
    vocab_parallel_group: dist.ProcessGroup | None = None,
    context_parallel_group: dist.ProcessGroup | None = None,
    sampling_params: TrainingSamplingParams | None = None,
    chunk_size: int | None = None,
) -> tuple[dict[str, Any], BatchedDataDict[Any]]:
    """`prepare_loss_input` of packed ``logits`` ``[1, T, V]`` (or a vocab shard) for the padded ``data`` ``[B, S]``
    in one pass: the logits are unpacked to ``[B, S, V]`` first."""
    rows = unpacked_logits(logits, cu_seqlens_q, cu_seqlens_q_padded, data["input_ids"].shape[1])
    parallel = (vocab_parallel_rank, vocab_parallel_group, context_parallel_group)
    return prepare_loss_input(rows, data, loss_fn, *parallel, sampling_params=sampling_params, chunk_size=chunk_size)


def _one_sample(data: BatchedDataDict[Any], index: int, length: int) -> BatchedDataDict[Any]:
    """Row ``index`` of ``data``, its token-wise tensors cut to the sample's ``length`` (NeMo-RL's unpadding)."""
    row: BatchedDataDict[Any] = BatchedDataDict()
    for key, value in data.items():
        if isinstance(value, torch.Tensor):
            value = value[index : index + 1]
            row[key] = value[:, :length] if value.dim() > 1 and value.shape[1] > 1 else value
        else:
            row[key] = value[index : index + 1]
    return row


def _add_metrics(total: dict[str, Any], metrics: Mapping[str, Any]) -> None:
    for key, value in metrics.items():
        value = value.item() if isinstance(value, torch.Tensor) and value.dim() == 0 else value
        if key in _LOWEST or key in _HIGHEST:
            # a sample without valid tokens reports ±inf: it does not count
            start = math.inf if key in _LOWEST else -math.inf
            pick = min if key in _LOWEST else max
            total[key] = total.get(key, start) if math.isinf(value) else pick(total.get(key, start), value)
        else:
            total[key] = total.get(key, 0) + value


class SequencePackingLossWrapper:
    """``loss_fn`` on packed logits, one sample at a time: sample i's slice of the packed row and its row of the
    padded data (cut to its length) go through ``prepare_fn`` (`prepare_loss_input`) and the loss; the losses and
    metrics are summed (NeMo-RL's ``probs_ratio_{,clamped_}{min,max}`` take the min / max)."""

    def __init__(
        self,
        loss_fn: LossFunction,
        prepare_fn: Callable[..., Any],
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_q_padded: torch.Tensor | None = None,
        vocab_parallel_rank: int | None = None,
        vocab_parallel_group: dist.ProcessGroup | None = None,
        context_parallel_group: dist.ProcessGroup | None = None,
    ) -> None:
        self.loss_fn, self.prepare_fn = loss_fn, prepare_fn
        self.cu_seqlens_q, self.cu_seqlens_q_padded = cu_seqlens_q, cu_seqlens_q_padded
        self.parallel = {
            "vocab_parallel_rank": vocab_parallel_rank,
            "vocab_parallel_group": vocab_parallel_group,
            "context_parallel_group": context_parallel_group,
        }

    def __call__(
        self,
        next_token_logits: torch.Tensor,
        data: BatchedDataDict[Any],
        global_valid_seqs: torch.Tensor | None,
        global_valid_toks: torch.Tensor | None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        lengths, starts = _lengths_and_starts(self.cu_seqlens_q, self.cu_seqlens_q_padded)
        loss_total: Any = 0
        metrics: dict[str, Any] = {}
        for index, (start, length) in enumerate(zip(starts, lengths, strict=True)):
            logits = next_token_logits.narrow(1, start, length)
            sample = _one_sample(data, index, length)
            prepared = self.prepare_fn(logits=logits, data=sample, loss_fn=self.loss_fn, **self.parallel)
            loss, sample_metrics = _call_loss(self.loss_fn, prepared, global_valid_seqs, global_valid_toks)
            loss_total = loss_total + loss
            _add_metrics(metrics, sample_metrics)
        return loss_total, metrics


class SequencePackingFusionLossWrapper(SequencePackingLossWrapper):
    """`SequencePackingLossWrapper`'s result from one loss call: ``prepare_fn`` (`prepare_packed_loss_input`)
    receives the whole packed row with ``cu_seqlens_q`` / ``cu_seqlens_q_padded`` and the padded data."""

    def __call__(
        self,
        next_token_logits: torch.Tensor,
        data: BatchedDataDict[Any],
        global_valid_seqs: torch.Tensor | None,
        global_valid_toks: torch.Tensor | None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        padded = self.cu_seqlens_q if self.cu_seqlens_q_padded is None else self.cu_seqlens_q_padded
        prepared = self.prepare_fn(
            logits=next_token_logits,
            data=data,
            loss_fn=self.loss_fn,
            cu_seqlens_q=self.cu_seqlens_q,
            cu_seqlens_q_padded=padded,
            **self.parallel,
        )
        return _call_loss(self.loss_fn, prepared, global_valid_seqs, global_valid_toks)


__getattr__ = refusing_getattr(__name__, {"DraftLossWrapper": "training a speculative-decoding (EAGLE) draft model"})
