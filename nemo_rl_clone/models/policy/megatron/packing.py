"""Sequence packing and context parallelism for the Megatron backend on its local (non-Transformer-Engine) spec.

Megatron Core runs packed sequences in its ``thd`` format: one row holding every sample of a microbatch back to
back, their boundaries in a `PackedSeqParams` (cumulative lengths). Its rotary embedding already restarts the
positions at each boundary; its local attention (`DotProductAttention`) refuses the format, and context parallelism
needs Transformer Engine's attention. `PackedCoreAttention` takes both:

- packed rows: causal SDPA per sample, on that sample's slice of the queries, keys and values (work linear in the
  number of samples, as a varlen kernel's; padded rows still run through Megatron's own attention);
- context parallelism (``megatron_cfg.context_parallel_size``): each sample is split into ``2·cp`` chunks and cp
  rank ``r`` holds chunks ``r`` and ``2·cp-1-r`` (Megatron's load balancing for causal attention, the layout its
  rotary embedding expects). Keys and values are all-gathered over the cp group (differentiably); each rank's
  queries attend to the sample's keys up to their own positions. Everything else in a decoder is per token.

`PackedLayout` turns a microbatch's right-padded rows into that form and the last stage's logits back into the
padded ``[B, S, V/tp]`` layout the losses read (gathered over the cp ranks, so every cp rank computes the same
loss; its gradient flows back to the rank that computed each position).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.dot_product_attention import DotProductAttention

from nemo_rl_clone.distributed.collectives import gather_along


class PackedLayout:
    """The packed form of one microbatch: right-padded rows with valid lengths ``input_lengths`` ``[B]`` and width
    ``width``, run as one ``thd`` row on this context-parallel rank.

    Each sample is padded to a multiple of ``2·cp`` (cp > 1) and the last one further, so that each cp rank's share
    of the row splits evenly over ``sequence_multiple`` ranks (sequence parallelism: the tensor-parallel size). The
    padding sits at the end of a sample, where causal attention keeps the sample's tokens from seeing it."""

    def __init__(
        self, input_lengths: torch.Tensor, width: int, cp_rank: int, cp_size: int, sequence_multiple: int = 1
    ) -> None:
        lengths = input_lengths.long().cpu()
        if len(lengths) == 0 or int(lengths.min()) < 1 or int(lengths.max()) > width:
            raise ValueError(f"packed rows need 1 <= input_lengths <= {width} (the row width), got {lengths.tolist()}")
        unit = 2 * cp_size if cp_size > 1 else 1
        padded = -(-lengths // unit) * unit
        align = math.lcm(unit, cp_size * sequence_multiple)
        padded[-1] += -int(padded.sum()) % align
        self.cp_rank, self.cp_size = cp_rank, cp_size
        self.valid = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)  # [B, S]
        starts = torch.cat([torch.zeros(1, dtype=torch.long), padded.cumsum(0)])
        self.cu_seqlens = starts.to(torch.int32)
        # where each valid (row, column) sits in the whole packed row
        self.full_index = (starts[:-1].unsqueeze(1) + torch.arange(width).unsqueeze(0))[self.valid]
        self.full_length = int(starts[-1])
        self.max_length = int(padded.max())
        held = [self._positions_held(starts, rank) for rank in range(cp_size)]
        self.local_index = held[cp_rank]  # the packed-row positions this cp rank runs, in its order
        self.gathered_order = torch.cat(held).argsort()  # rank-major gathered layout → packed-row order

    def _positions_held(self, starts: torch.Tensor, rank: int) -> torch.Tensor:
        if self.cp_size == 1:
            return torch.arange(int(starts[-1]))
        pieces = []
        for start, end in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True):
            chunk = (end - start) // (2 * self.cp_size)
            for index in (rank, 2 * self.cp_size - 1 - rank):
                pieces.append(torch.arange(start + index * chunk, start + (index + 1) * chunk))
        return torch.cat(pieces)

    @property
    def num_tokens(self) -> int:
        """Tokens this rank's model runs."""
        return len(self.local_index)

    def pack(self, padded: torch.Tensor, fill: int = 0) -> torch.Tensor:
        """``[B, S, ...]`` → ``[1, T_local, ...]``: this rank's share of the packed row (``fill`` at the padding)."""
        full = padded.new_full((self.full_length, *padded.shape[2:]), fill)
        full[self.full_index.to(padded.device)] = padded[self.valid.to(padded.device)]
        return full[self.local_index.to(padded.device)].unsqueeze(0)

    def position_ids(self, device: torch.device) -> torch.Tensor:
        columns = torch.arange(self.valid.shape[1], device=device).expand(self.valid.shape)
        return self.pack(columns)

    def unpack(self, local: torch.Tensor) -> torch.Tensor:
        """``[1, T_local, ...]`` → ``[B, S, ...]`` (zeros at the padding), gathered over the cp ranks (differentiable)."""
        if self.cp_size > 1:
            gathered = gather_along(local, 1, parallel_state.get_context_parallel_group())
            local = gathered.index_select(1, self.gathered_order.to(local.device))
        out = local.new_zeros((*self.valid.shape, *local.shape[2:]))
        return out.index_put((self.valid.to(local.device),), local[0, self.full_index.to(local.device)])

    def params(self, device: torch.device) -> PackedSeqParams:
        """Megatron's description of the packed row (lengths of the whole samples, before the cp split)."""
        cu_seqlens = self.cu_seqlens.to(device)
        return PackedSeqParams(
            qkv_format="thd",
            cu_seqlens_q=cu_seqlens,
            cu_seqlens_kv=cu_seqlens,
            cu_seqlens_q_padded=cu_seqlens,
            cu_seqlens_kv_padded=cu_seqlens,
            max_seqlen_q=self.max_length,
            max_seqlen_kv=self.max_length,
        )


class PackedCoreAttention(DotProductAttention):
    """Megatron's local core attention for padded rows; for packed rows (``packed_seq_params``, ``thd``) causal
    SDPA per sample, over the context-parallel ranks when cp > 1 (see the module docstring)."""

    def __init__(self, config: TransformerConfig, *args: Any, **kwargs: Any) -> None:
        # Megatron's class refuses cp > 1 (its padded-row path has no cp); here cp only ever runs packed rows.
        super().__init__(dataclasses.replace(config, context_parallel_size=1), *args, **kwargs)
        self.config = config
        self.cp_size = config.context_parallel_size
        self.scale = self.softmax_scale * (self.layer_number if config.apply_query_key_layer_scaling else 1)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: PackedSeqParams | None = None,
    ) -> torch.Tensor:
        if packed_seq_params is None:
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias)
        if packed_seq_params.qkv_format != "thd" or attention_bias is not None:
            raise ValueError("packed attention takes thd-format sequence boundaries and no attention bias")
        # query [t, heads, d], key/value [t, groups, d]: this rank's tokens of the packed row
        repeat = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
        boundaries = packed_seq_params.cu_seqlens_q_padded
        if boundaries is None:
            boundaries = packed_seq_params.cu_seqlens_q
        edges = (boundaries // self.cp_size).tolist()
        if self.cp_size == 1:
            outputs = [self._attend(query[a:b], key[a:b], value[a:b], None) for a, b in itertools.pairwise(edges)]
        else:
            group = parallel_state.get_context_parallel_group()
            keys = gather_along(key, 0, group).chunk(self.cp_size)  # per cp rank: its tokens of the row
            values = gather_along(value, 0, group).chunk(self.cp_size)
            rank = parallel_state.get_context_parallel_rank()
            outputs = [
                out
                for a, b in itertools.pairwise(edges)
                for out in self._attend_context_parallel(query[a:b], keys, values, a, b, rank)
            ]
        return torch.cat(outputs).reshape(query.shape[0], -1)

    def _attend(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, query_start: int | None
    ) -> torch.Tensor:
        """Causal attention of ``query`` [q, heads, d] to ``key``/``value`` [k, heads, d] (positions 0..k-1); the
        queries sit at positions ``query_start``.. (None: the last q of the keys, the plain causal case)."""
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (query, key, value))
        if query_start is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        else:
            rows = torch.arange(query.shape[0], device=query.device).unsqueeze(1) + query_start
            mask = torch.arange(key.shape[0], device=query.device).unsqueeze(0) <= rows
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        return out.squeeze(0).transpose(0, 1)

    def _attend_context_parallel(
        self,
        query: torch.Tensor,
        keys: tuple[torch.Tensor, ...],
        values: tuple[torch.Tensor, ...],
        start: int,
        end: int,
        rank: int,
    ) -> list[torch.Tensor]:
        """One sample: this rank's two query chunks (``r`` and ``2·cp-1-r``) against the sample's keys in order;
        ``start:end`` is the sample's slice of every rank's share."""
        chunk = (end - start) // 2
        order = list(range(self.cp_size)) + list(reversed(range(self.cp_size)))  # owner of chunk c, c = 0..2cp-1
        halves = [0] * self.cp_size + [1] * self.cp_size
        pieces = [slice(start + half * chunk, start + (half + 1) * chunk) for half in halves]
        key = torch.cat([keys[owner][piece] for owner, piece in zip(order, pieces, strict=True)])
        value = torch.cat([values[owner][piece] for owner, piece in zip(order, pieces, strict=True)])
        outputs = []
        for half, index in enumerate((rank, 2 * self.cp_size - 1 - rank)):
            seen = (index + 1) * chunk  # causal: keys up to the end of this chunk
            q = query[half * chunk : (half + 1) * chunk]
            outputs.append(self._attend(q, key[:seen], value[:seen], index * chunk))
        return outputs
