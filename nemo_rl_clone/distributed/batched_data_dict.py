"""``BatchedDataDict``: the batch container passed between the driver and Ray workers.

A dict of per-sample values that share dimension 0: tensors of shape ``[B, ...]`` and Python lists of length
``B``. It knows how to concatenate batches (padding ragged tensors), shard them over data-parallel ranks and cut
them into microbatches, optionally bounded by a token budget (dynamic batching or sequence packing).

Validation rule: every value must be a tensor with ``ndim >= 1`` or a ``list``, and all must have the same length
along dim 0. It is checked on construction and by every operation that needs the batch size (``size`` and all
methods below); plain ``d[key] = value`` assignments are not checked, so a batch may be built up key by key.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from copy import deepcopy
from dataclasses import replace
from typing import Any, ClassVar, Generic, NotRequired, Self, TypedDict

import torch
import torch.distributed as dist
from typing_extensions import TypeVar

from nemo_rl_clone.distributed.batch_sharding import (
    MicrobatchKind,
    MicrobatchPlan,
    as_int_list,
    checked_global_batch_size,
    checked_microbatching_args,
    contiguous_shard_rows,
    plan_token_bounded,
    sample_lengths,
    split_sizes,
)

DictT = TypeVar("DictT", bound=Mapping[str, Any], default=Mapping[str, Any])
_BatchT = TypeVar("_BatchT", bound="BatchedDataDict[Any]")


class DynamicBatchingArgs(TypedDict):
    """``dynamic_batching_args`` of `BatchedDataDict.shard_by_batch_size`."""

    max_tokens_per_microbatch: int
    sequence_length_round: int
    input_key: str
    input_lengths_key: str


class SequencePackingArgs(TypedDict):
    """``sequence_packing_args`` of `BatchedDataDict.shard_by_batch_size`; the rounding is given under either name."""

    max_tokens_per_microbatch: int
    input_key: str
    input_lengths_key: str
    algorithm: str
    sequence_length_pad_multiple: NotRequired[int]
    sequence_length_round: NotRequired[int]


class BatchedDataDict(dict[str, Any], Generic[DictT]):
    """A dict of tensors ``[B, ...]`` and lists of length ``B`` (see module docstring for validation).

    The type parameter (e.g. ``BatchedDataDict[DatumSpec]``) only documents the expected keys.
    """

    microbatch_plan: MicrobatchPlan | None = None
    # Keys handed to a model beside its token inputs (Gemma 3 marks image tokens with them); see get_multimodal_dict.
    ADDITIONAL_OPTIONAL_KEY_TENSORS: ClassVar[list[str]] = ["token_type_ids"]

    def __init__(self, data: Mapping[str, Any] | Iterable[tuple[str, Any]] = (), /, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        _ = self.size

    # ---------------------------------------------------------------- basics
    @property
    def size(self) -> int:
        """Number of samples (length of dim 0); 0 for an empty dict. Raises on invalid or unequal values."""
        lengths: dict[str, int] = {}
        for key, value in self.items():
            if isinstance(value, torch.Tensor) and value.ndim >= 1:
                lengths[key] = value.shape[0]
            elif isinstance(value, list):
                lengths[key] = len(value)
            else:
                shape = f" with shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else ""
                raise TypeError(
                    f"BatchedDataDict[{key!r}] must be a torch.Tensor with ndim >= 1 or a list, "
                    f"got {type(value).__name__}{shape}"
                )
        if len(set(lengths.values())) > 1:
            listing = ", ".join(f"{key}={length}" for key, length in lengths.items())
            raise ValueError(f"BatchedDataDict values must have the same length along dim 0, got {listing}")
        return next(iter(lengths.values()), 0)

    @property
    def micro_batch_indices(self) -> list[list[tuple[int, int]]] | None:
        return self.microbatch_plan.indices if self.microbatch_plan else None

    @property
    def micro_batch_lengths(self) -> list[list[int]] | None:
        return self.microbatch_plan.lengths if self.microbatch_plan else None

    @property
    def elem_counts_per_gb(self) -> list[int] | None:
        """Rows of each global batch in this shard, for a sequence-packing plan (None otherwise)."""
        plan = self.microbatch_plan
        if plan is None or plan.kind != "packing":
            return None
        return [sum(end - start for start, end in ranges) for ranges in plan.indices]

    @property
    def data(self) -> Self:
        """This dict itself (NeMo-RL's container keeps its values in ``.data``)."""
        return self

    def get_dict(self) -> Self:
        """This dict itself; mutations show in the batch."""
        return self

    def get_multimodal_dict(self, as_tensors: bool = False, device: torch.device | str | None = None) -> dict[str, Any]:
        """The model-specific extra inputs present (keys of ``ADDITIONAL_OPTIONAL_KEY_TENSORS``).

        Multimodal packed tensors (images) are not supported yet, so ``as_tensors`` changes nothing; ``device``
        moves the returned tensors.
        """
        del as_tensors  # only relevant to packed multimodal tensors
        extras = {key: self[key] for key in self.ADDITIONAL_OPTIONAL_KEY_TENSORS if key in self}
        if device is not None:
            extras = {
                key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in extras.items()
            }
        return extras

    def copy(self) -> Self:
        """Shallow copy: a new dict of the same class (keeping the microbatch plan) whose values are the same tensor/list objects."""
        result = type(self)(self)
        result.microbatch_plan = self.microbatch_plan
        return result

    def to(self, device: torch.device | str) -> Self:
        """Move every tensor value to ``device`` in place (list contents are left alone); returns ``self``."""
        for key, value in self.items():
            if isinstance(value, torch.Tensor):
                self[key] = value.to(device)
        return self

    # ---------------------------------------------------------------- combine
    @classmethod
    def from_batches(
        cls, batches: Sequence[Mapping[str, Any]], pad_value_dict: Mapping[str, Any] | None = None
    ) -> Self:
        """Concatenate batches along dim 0.

        Tensors of one key must have the same ndim; where their trailing sizes differ, each is right-padded to
        the largest size per dim with ``pad_value_dict[key]`` (default 0). Lists are concatenated. All batches
        must have the same keys. An empty ``batches`` gives an empty ``BatchedDataDict``.
        """
        batches = list(batches)
        if not batches:
            return cls()
        keys = list(batches[0])
        for i, batch in enumerate(batches):
            if set(batch) != set(keys):
                missing = sorted(set(keys) - set(batch))
                extra = sorted(set(batch) - set(keys))
                raise ValueError(
                    f"from_batches: batch {i} has different keys than batch 0: missing {missing}, unexpected {extra}"
                )
            _ = batch.size if isinstance(batch, BatchedDataDict) else BatchedDataDict(batch).size
        pad_value_dict = pad_value_dict or {}
        result = cls()
        for key in keys:
            values = [batch[key] for batch in batches]
            if all(isinstance(v, torch.Tensor) for v in values):
                result[key] = _concat_padded(key, values, pad_value_dict.get(key, 0))
            elif all(isinstance(v, list) for v in values):
                result[key] = list(itertools.chain.from_iterable(values))
            else:
                kinds = [type(v).__name__ for v in values]
                raise TypeError(f"from_batches: key {key!r} mixes value types across batches: {kinds}")
        _ = result.size
        return result

    def all_gather(
        self, group: dist.ProcessGroup | None = None, pad_value_dict: Mapping[str, Any] | None = None
    ) -> BatchedDataDict:
        """Gather this batch from every rank of ``group`` (default: world) and concatenate them in rank order.

        A collective: every rank of ``group`` must call it. Uses ``all_gather_object`` (pickling), so it works
        with any backend and with ragged batches, which ``from_batches`` pads.
        """
        gathered: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, self, group=group)
        return BatchedDataDict.from_batches(gathered, pad_value_dict)

    # ---------------------------------------------------------------- select
    def slice(self, start: int, end: int) -> SlicedDataDict:
        """Samples ``start .. end-1`` (requires ``0 <= start <= end <= size``). Tensors are views; lists are new."""
        size = self.size
        if not 0 <= start <= end <= size:
            raise IndexError(f"slice({start}, {end}) is out of range for a batch of size {size}")
        return SlicedDataDict({key: value[start:end] for key, value in self.items()})

    def select_indices(self, indices: Sequence[int] | torch.Tensor) -> Self:
        """New batch whose sample ``j`` is sample ``indices[j]`` of this one (repeats allowed, no negatives)."""
        return self._gathered(indices, type(self))

    def _gathered(self, indices: Sequence[int] | torch.Tensor, result_type: type[_BatchT]) -> _BatchT:
        size = self.size
        index = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
        if isinstance(indices, torch.Tensor) and indices.is_floating_point():
            raise TypeError(f"select_indices needs integer indices, got a {indices.dtype} tensor")
        bad = ((index < 0) | (index >= size)).nonzero()
        if bad.numel():
            position = int(bad[0])
            raise IndexError(
                f"select_indices: index {int(index[position])} at position {position} is out of range "
                f"for a batch of size {size}"
            )
        positions = index.tolist()
        return result_type(
            {
                key: value.index_select(0, index.to(value.device))
                if isinstance(value, torch.Tensor)
                else [value[i] for i in positions]
                for key, value in self.items()
            }
        )

    def chunk(self, rank: int, chunks: int) -> SlicedDataDict:
        """Contiguous chunk ``rank`` of ``chunks`` near-equal chunks (the first ``size % chunks`` get one extra)."""
        if chunks < 1 or not 0 <= rank < chunks:
            raise ValueError(f"chunk(rank={rank}, chunks={chunks}) needs chunks >= 1 and 0 <= rank < chunks")
        sizes = split_sizes(self.size, chunks)
        start = sum(sizes[:rank])
        return self.slice(start, start + sizes[rank])

    def get_batch(self, batch_idx: int, batch_size: int | None = None) -> SlicedDataDict:
        """Samples of global batch ``batch_idx`` (``[batch_idx * batch_size, (batch_idx + 1) * batch_size)``).

        A microbatch plan, if present, is narrowed to that global batch (indices re-based to its start); with a
        plan, ``batch_size`` defaults to this shard's rows per global batch.
        """
        size = self.size
        if batch_size is None:
            if self.microbatch_plan is None or not self.microbatch_plan.indices:
                raise ValueError("get_batch: pass batch_size (this batch has no microbatch plan to take it from)")
            batch_size = size // len(self.microbatch_plan.indices)
        if batch_size < 1:
            raise ValueError(f"get_batch: batch_size must be >= 1, got {batch_size}")
        start, end = batch_idx * batch_size, (batch_idx + 1) * batch_size
        if batch_idx < 0 or end > size:
            raise IndexError(f"get_batch({batch_idx}, {batch_size}) needs samples {start}..{end - 1}, batch has {size}")
        batch = self.slice(start, end)
        plan = self.microbatch_plan
        if plan is not None:
            if len(plan.indices) * batch_size != size:
                raise ValueError(
                    f"get_batch: this shard's microbatch plan covers {len(plan.indices)} global batches of "
                    f"{size} samples, which does not match batch_size={batch_size}"
                )
            batch.microbatch_plan = replace(
                plan,
                indices=[[(s - start, e - start) for s, e in plan.indices[batch_idx]]],
                lengths=[list(plan.lengths[batch_idx])],
            )
        return batch

    def repeat_interleave(self, num_repeats: int) -> Self:
        """Each sample repeated ``num_repeats`` times, adjacent (``[a, b] -> [a, a, b, b]``), e.g. GRPO groups.

        List items are deep-copied per repeat so that repeats can be mutated independently (rollouts append to
        each sample's message log).
        """
        if num_repeats < 1:
            raise ValueError(f"repeat_interleave: num_repeats must be >= 1, got {num_repeats}")
        _ = self.size
        return type(self)(
            {
                key: value.repeat_interleave(num_repeats, dim=0)
                if isinstance(value, torch.Tensor)
                else [deepcopy(item) for item in value for _ in range(num_repeats)]
                for key, value in self.items()
            }
        )

    def reorder_data(self, reordered_indices: Sequence[int] | torch.Tensor) -> None:
        """In place, move the sample at position ``j`` to position ``reordered_indices[j]``.

        This is the inverse of ``select_indices``: after ``shards, order = shard_by_batch_size(...)`` with dynamic
        batching or packing, ``from_batches(per_shard_outputs).reorder_data(order)`` restores the input order.
        ``reordered_indices`` must be a permutation of ``range(size)``. Drops any microbatch plan.
        """
        size = self.size
        order = torch.as_tensor(reordered_indices, dtype=torch.long).reshape(-1)
        if order.numel() != size or not torch.equal(order.sort().values, torch.arange(size)):
            raise ValueError(f"reorder_data needs a permutation of range({size}), got {order.tolist()}")
        restored = self.select_indices(torch.argsort(order))
        self.clear()
        self.update(restored)
        self.microbatch_plan = None

    def truncate_tensors(self, dim: int, truncated_len: int) -> None:
        """In place, keep the first ``truncated_len`` entries along ``dim`` of every tensor with more than ``dim``
        dimensions (views, no copy). Raises if a tensor is shorter than ``truncated_len`` along ``dim``."""
        for key, value in self.items():
            if isinstance(value, torch.Tensor) and value.ndim > dim:
                if value.shape[dim] < truncated_len:
                    raise ValueError(
                        f"truncate_tensors: {key!r} has {value.shape[dim]} entries along dim {dim}, "
                        f"fewer than truncated_len={truncated_len}"
                    )
                self[key] = value.narrow(dim, 0, truncated_len)

    # ---------------------------------------------------------------- microbatches
    def make_microbatch_iterator(self, microbatch_size: int) -> Iterator[SlicedDataDict]:
        """Consecutive microbatches of ``microbatch_size`` samples; a last, smaller one holds the remainder."""
        if microbatch_size < 1:
            raise ValueError(f"microbatch_size must be >= 1, got {microbatch_size}")
        size = self.size
        for start in range(0, size, microbatch_size):
            yield self.slice(start, min(start + microbatch_size, size))

    def make_microbatch_iterator_with_dynamic_shapes(self, sequence_dim: int = 1) -> Iterator[SlicedDataDict]:
        """Microbatches of a dynamic-batching plan, all global batches in order.

        Each has its sequence dim (``sequence_dim`` of every tensor as wide there as ``plan.input_key``) truncated
        to the microbatch's padded length (capped at the stored width). Empty microbatches (0 rows) can occur only
        with uneven shards; they keep every rank's microbatch count equal.
        """
        plan = self._require_plan("dynamic")
        for ranges, lengths in zip(plan.indices, plan.lengths, strict=True):
            for (start, end), length in zip(ranges, lengths, strict=True):
                yield self._truncated_slice(start, end, length, sequence_dim)

    def get_microbatch_iterator_dynamic_shapes_len(self) -> int:
        """How many microbatches `make_microbatch_iterator_with_dynamic_shapes` yields."""
        return sum(len(ranges) for ranges in self._require_plan("dynamic").indices)

    def get_microbatch_iterator_for_packable_sequences_len(self) -> tuple[int, int]:
        """``(number of bins, largest bin's token total)`` of the sequence-packing plan."""
        plan = self._require_plan("packing")
        return sum(len(ranges) for ranges in plan.indices), max(itertools.chain.from_iterable(plan.lengths), default=0)

    def make_microbatch_iterator_for_packable_sequences(self) -> Iterator[SlicedDataDict]:
        """Bins of a sequence-packing plan, all global batches in order, one ``BatchedDataDict`` per bin.

        Rows are still padded samples, truncated along the sequence dim to the longest sample in the bin; the
        consumer packs them into one row using ``plan.input_lengths_key``. ``micro_batch_lengths`` gives each
        bin's token total. Empty bins (0 rows) can occur only with uneven shards.
        """
        plan = self._require_plan("packing")
        lengths = as_int_list(self[plan.input_lengths_key])
        for start, end in itertools.chain.from_iterable(plan.indices):
            yield self._truncated_slice(start, end, max(lengths[start:end], default=0))

    # ---------------------------------------------------------------- sharding
    def shard_by_batch_size(
        self,
        shards: int,
        batch_size: int | None = None,
        allow_uneven_shards: bool = False,
        dynamic_batching_args: Mapping[str, Any] | None = None,
        sequence_packing_args: Mapping[str, Any] | None = None,
        rows_per_group: int = 1,
    ) -> list[SlicedDataDict] | tuple[list[SlicedDataDict], list[int]]:
        """Split into ``shards`` data-parallel shards (`SlicedDataDict`), global batch by global batch.

        The batch is a sequence of global batches of ``batch_size`` samples (one if ``None``). Each global batch
        is split into ``shards`` pieces and shard ``i`` holds its piece of every global batch, in order, so every
        rank sees the same number of samples per optimizer step. ``batch_size`` must divide the size, and
        ``shards`` must divide ``batch_size`` unless ``allow_uneven_shards`` (then the first shards get one extra).

        Plain sharding gives contiguous pieces and returns ``list[BatchedDataDict]``.

        With ``dynamic_batching_args`` (``input_key``, ``input_lengths_key``, ``max_tokens_per_microbatch``,
        ``sequence_length_round``) or ``sequence_packing_args`` (``input_key``, ``input_lengths_key``,
        ``max_tokens_per_microbatch``, ``algorithm`` in ``PACKING_ALGORITHMS``, optional
        ``sequence_length_round`` or its NeMo-RL name ``sequence_length_pad_multiple``, default 1), each global batch is sorted by length and dealt round-robin to
        the shards (balancing tokens per rank). Inside each shard, samples are cut into length-sorted padded
        microbatches of at most ``max_tokens_per_microbatch`` padded tokens, or bin-packed into bins of at most
        that many tokens (each sample costs its length rounded up to ``sequence_length_round``). Every shard
        then gets the same number of microbatches per global batch, needed because FSDP collectives run once
        per microbatch on every rank: shards with fewer are split further (halving their largest microbatch).
        Each shard carries a ``MicrobatchPlan`` and the call returns ``(shards, order)`` where ``order[j]`` is
        the input index of row ``j`` of the shards concatenated in shard order; restore the input order of
        per-shard outputs with ``from_batches(outputs).reorder_data(order)``.

        ``rows_per_group`` (sequence packing only): rows come in adjacent groups of that many (preference pairs)
        that stay together, in order, in one bin; see ``plan_packed_groups``.
        """
        if dynamic_batching_args is not None and sequence_packing_args is not None:
            raise ValueError("shard_by_batch_size: pass dynamic_batching_args or sequence_packing_args, not both")
        size = self.size
        batch_size = checked_global_batch_size(size, shards, batch_size, allow_uneven_shards)
        num_batches = size // batch_size if size else 0
        if dynamic_batching_args is not None:
            return self._shard_token_bounded(shards, batch_size, num_batches, "dynamic", dynamic_batching_args)
        if rows_per_group != 1 and sequence_packing_args is None:
            raise ValueError("shard_by_batch_size: rows_per_group needs sequence_packing_args")
        if sequence_packing_args is not None:
            return self._shard_token_bounded(
                shards, batch_size, num_batches, "packing", sequence_packing_args, rows_per_group
            )
        rows = contiguous_shard_rows(size, shards, batch_size, num_batches)
        return [self._gathered(shard_rows, SlicedDataDict) for shard_rows in rows]

    def _shard_token_bounded(
        self,
        shards: int,
        batch_size: int,
        num_batches: int,
        kind: MicrobatchKind,
        args: Mapping[str, Any],
        rows_per_group: int = 1,
    ) -> tuple[list[SlicedDataDict], list[int]]:
        """Token-bounded sharding; see ``shard_by_batch_size`` and ``plan_token_bounded_shards``."""
        args = checked_microbatching_args(args, kind)
        lengths = sample_lengths(self, args["input_lengths_key"], args["input_key"]) if num_batches else []
        plans = plan_token_bounded(lengths, shards, batch_size, kind, args, rows_per_group)
        result = []
        for plan in plans:
            shard = self._gathered(plan.order, SlicedDataDict)
            shard.microbatch_plan = MicrobatchPlan(
                kind, args["input_key"], args["input_lengths_key"], plan.ranges, plan.tokens
            )
            result.append(shard)
        return result, list(itertools.chain.from_iterable(plan.order for plan in plans))

    # ---------------------------------------------------------------- helpers
    def _require_plan(self, kind: str) -> MicrobatchPlan:
        plan = self.microbatch_plan
        if plan is None or plan.kind != kind:
            argument = "dynamic_batching_args" if kind == "dynamic" else "sequence_packing_args"
            found = plan.kind if plan else "none"
            raise ValueError(
                f"this batch has no {kind} microbatch plan (found: {found}); make it with "
                f"shard_by_batch_size(..., {argument}=...)"
            )
        return plan

    def _truncated_slice(self, start: int, end: int, length: int, sequence_dim: int = 1) -> SlicedDataDict:
        assert self.microbatch_plan is not None
        width = self[self.microbatch_plan.input_key].shape[sequence_dim]
        batch = self.slice(start, end)
        for key, value in batch.items():
            if isinstance(value, torch.Tensor) and value.ndim > sequence_dim and value.shape[sequence_dim] == width:
                batch[key] = value.narrow(sequence_dim, 0, min(length, width))
        return batch


def _concat_padded(key: str, tensors: list[torch.Tensor], pad_value: Any) -> torch.Tensor:
    """Concatenate along dim 0, right-padding every trailing dim to its largest size with ``pad_value``."""
    ndims = {t.ndim for t in tensors}
    if len(ndims) > 1:
        shapes = [tuple(t.shape) for t in tensors]
        raise ValueError(f"from_batches: key {key!r} has tensors of different ndim across batches: {shapes}")
    trailing = [max(t.shape[d] for t in tensors) for d in range(1, tensors[0].ndim)]
    if all(list(t.shape[1:]) == trailing for t in tensors):
        return torch.cat(tensors)
    dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
    rows = sum(t.shape[0] for t in tensors)
    out = torch.full((rows, *trailing), pad_value, dtype=dtype, device=tensors[0].device)
    row = 0
    for t in tensors:
        out[(slice(row, row + t.shape[0]), *(slice(0, s) for s in t.shape[1:]))] = t
        row += t.shape[0]
    return out


class SlicedDataDict(BatchedDataDict[DictT]):
    """A `BatchedDataDict` that is a slice or shard of a larger batch: what slicing, chunking and sharding return."""
