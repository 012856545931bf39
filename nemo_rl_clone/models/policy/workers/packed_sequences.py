"""Sequence packing for the DTensor worker: a microbatch's samples run as one row with no padding.

A token-bounded packing plan (``policy.sequence_packing``) groups samples into bins; `PackedRows` concatenates a
bin's right-padded rows ``[B, S]`` into one row ``[1, T]`` (T = Σ input_lengths), gives each sample position ids
that restart at 0, and maps the model's per-token outputs back to the padded layout, so losses and logprob
consumers never see the packed form.

Attention must stay inside each sample. A dense block-diagonal mask would do that at a cost quadratic in T (on
CPU, SDPA computes every masked block), so the model runs with the ``packed_sdpa`` attention registered here: it
calls Hugging Face's SDPA kernel once per sample, causal, on that sample's slice of the queries, keys and values —
work linear in the number of samples, as a varlen kernel's. The boundaries travel as the standard
``cu_seq_lens_q/k`` and ``max_length_q/k`` model kwargs, which Hugging Face's FlashAttention-2 varlen path reads too.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

PACKED_ATTENTION = "packed_sdpa"


def packed_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Hugging Face's attention-function contract: ``query`` ``[1, heads, T, d]``, ``key``/``value``
    ``[1, kv_heads, T, d]`` → ``[1, T, heads, d]``. Without ``cu_seq_lens_q`` (an unpacked forward) it is plain SDPA."""
    boundaries = kwargs.pop("cu_seq_lens_q", None)
    for unused in ("cu_seq_lens_k", "max_length_q", "max_length_k"):
        kwargs.pop(unused, None)
    if boundaries is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if attention_mask is not None:
        raise ValueError("packed_sdpa attention takes sequence boundaries (cu_seq_lens_q), not an attention mask")
    edges = boundaries.tolist()
    outputs = [
        sdpa_attention_forward(
            module, query[:, :, start:end], key[:, :, start:end], value[:, :, start:end], None, is_causal=True, **kwargs
        )[0]
        for start, end in itertools.pairwise(edges)
        if end > start
    ]
    return torch.cat(outputs, dim=1), None


AttentionInterface.register(PACKED_ATTENTION, packed_sdpa_attention)


class PaddedRows:
    """The identity layout: a microbatch that runs as its right-padded rows (no sequence packing)."""

    def __init__(self, input_ids: torch.Tensor) -> None:
        self.num_tokens = input_ids.numel()

    def pack(self, padded: torch.Tensor) -> torch.Tensor:
        return padded

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        return packed

    def model_kwargs(self) -> dict[str, Any]:
        return {}


class PackedRows:
    """The packed form of right-padded rows with valid lengths ``input_lengths`` ``[B]`` and width ``S``.

    Samples keep their order: the packed row is sample 0's valid tokens, then sample 1's, and so on.
    """

    def __init__(self, input_lengths: torch.Tensor, width: int) -> None:
        lengths = input_lengths.long()
        if len(lengths) and (int(lengths.min()) < 1 or int(lengths.max()) > width):
            raise ValueError(f"packed rows need 1 <= input_lengths <= {width} (the row width), got {lengths.tolist()}")
        columns = torch.arange(width, device=lengths.device)
        self.valid = columns.unsqueeze(0) < lengths.unsqueeze(1)  # [B, S]
        self.width = width
        self.position_ids = columns.expand(len(lengths), width)[self.valid].unsqueeze(0)  # [1, T]
        cu_seqlens = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=lengths.device)
        cu_seqlens[1:] = lengths.cumsum(0)
        self.cu_seqlens = cu_seqlens
        self.max_length = int(lengths.max()) if len(lengths) else 0
        self.num_tokens = self.position_ids.shape[1]  # the tokens the model computes: Σ input_lengths

    def pack(self, padded: torch.Tensor) -> torch.Tensor:
        """``[B, S, ...]`` → ``[1, T, ...]``: the valid positions, row after row."""
        return padded[self.valid].unsqueeze(0)

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """``[1, T, ...]`` → ``[B, S, ...]``, zeros at the padding (differentiable)."""
        out = packed.new_zeros((*self.valid.shape, *packed.shape[2:]))
        return out.index_put((self.valid,), packed[0])

    def model_kwargs(self) -> dict[str, Any]:
        """What a Hugging Face causal LM needs beside ``input_ids`` to run the packed row (see module doc)."""
        return {
            "position_ids": self.position_ids,
            "cu_seq_lens_q": self.cu_seqlens,
            "cu_seq_lens_k": self.cu_seqlens,
            "max_length_q": self.max_length,
            "max_length_k": self.max_length,
        }


def rows_for(input_ids: torch.Tensor, input_lengths: torch.Tensor | None, packed: bool) -> PaddedRows | PackedRows:
    """How a microbatch ``input_ids`` ``[B, S]`` runs through the model: packed (needs ``input_lengths``) or as is."""
    if not packed:
        return PaddedRows(input_ids)
    if input_lengths is None:
        raise KeyError("sequence packing needs the batch's 'input_lengths'")
    return PackedRows(input_lengths.to(input_ids.device), input_ids.shape[1])
