"""Next-token logprobs straight from a causal LM's final hidden states, at only the positions that are read.

A language-model head projects every position onto the whole vocabulary (``[B, S, V]``, V = 49,152 for SmolLM2),
yet a GRPO, SFT or DPO loss reads one number per response token: log p(next token). The prompt's and the padding's
logits are never used, and on CPU the head and its fp32 log-softmax are a fifth of a training step's work.
`SelectiveLMHead` computes ``log_softmax(h @ Wᵀ)[target]`` for the selected positions only, ``chunk_size``
positions at a time in both passes (the backward recomputes each chunk's logits), so neither the full logits nor
their fp32 softmax ever exist at once.

Shapes: ``positions`` ``[B, S]`` bool (position t selected: its prediction of token t + 1 is needed), ``targets``
``[B, S]`` (``targets[:, t]`` = token t + 1); the head then returns ``[B, S]`` fp32 logprobs, 0 where not selected.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from transformers import PreTrainedModel

from nemo_rl_clone.contract import sampling as logits_sampling_utils
from nemo_rl_clone.contract.sampling import TrainingSamplingParams

DEFAULT_CHUNK_SIZE = 1024  # positions per chunk: a [1024, 49152] fp32 block is 192 MiB


@dataclass(frozen=True)
class Selection:
    """What `SelectiveLMHead.selecting` computes: ``positions``/``targets`` ``[B, S]`` (module doc), ``chunk_size``
    positions at a time, matmuls in ``dtype`` (backward in ``grad_dtype``), under ``sampling``'s processing, and with
    ``also_unfiltered`` the temperature-only logprob beside it."""

    positions: torch.Tensor
    targets: torch.Tensor
    chunk_size: int
    dtype: torch.dtype
    grad_dtype: torch.dtype | None = None
    sampling: TrainingSamplingParams | None = None
    also_unfiltered: bool = False


class _ProjectedTokenLogprobs(torch.autograd.Function):
    """``[N]`` fp32 logprobs of ``targets`` under ``hidden [N, H] @ weight [V, H]ᵀ``: forward matmuls in ``dtype``,
    the backward's gradient matmuls in ``grad_dtype`` (its recomputed logits in ``dtype``, as in the forward).

    ``sampling``: under the distribution the engine sampled from (logits ÷ temperature, top-k/top-p kept set,
    `logits_sampling_utils`); with ``also_unfiltered`` the output is ``[N, 2]``: that and the temperature-only
    logprob (the KL term's), from the same projection."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        chunk_size: int,
        dtype: torch.dtype,
        grad_dtype: torch.dtype,
        sampling: TrainingSamplingParams | None,
        also_unfiltered: bool,
    ) -> torch.Tensor:
        w = weight.to(dtype)
        n = hidden.shape[0]
        out = torch.empty(n, 2 if also_unfiltered else 1, dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(out)  # column 0: over the kept tokens; column 1: over all of them
        threshold = torch.full((n,), -torch.inf, device=hidden.device)
        cutoff = torch.full((n,), logits_sampling_utils.NO_TIE_CUTOFF, device=hidden.device)
        filters = sampling is not None and sampling.filters
        for start in range(0, n, chunk_size):
            window = slice(start, start + chunk_size)
            logits = logits_sampling_utils.scale(hidden[window].to(dtype) @ w.t(), sampling)
            target_logit = logits.gather(-1, targets[window, None]).squeeze(-1)
            if also_unfiltered:
                lse[window, 1] = logits.logsumexp(dim=-1)
                out[window, 1] = target_logit - lse[window, 1]
            if filters:
                assert sampling is not None
                threshold[window], cutoff[window] = logits_sampling_utils.keep_boundary(logits, sampling)
                keep = logits_sampling_utils.kept_tokens(logits, threshold[window], cutoff[window], targets[window])
                logits = logits.masked_fill_(~keep, -torch.inf)
            lse[window, 0] = logits.logsumexp(dim=-1)
            out[window, 0] = target_logit - lse[window, 0]
        ctx.save_for_backward(hidden, weight, targets, lse, threshold, cutoff)
        ctx.chunk_size, ctx.dtype, ctx.grad_dtype, ctx.sampling = chunk_size, dtype, grad_dtype, sampling
        return out if also_unfiltered else out.squeeze(-1)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, targets, lse, threshold, cutoff = ctx.saved_tensors
        grad_out = grad_out.reshape(lse.shape)  # [N] or [N, 2]; N may be 0 (a microbatch with no loss token)
        w = weight.to(ctx.dtype)
        w_grad = weight.to(ctx.grad_dtype)
        temperature = ctx.sampling.temperature if ctx.sampling is not None else 1.0
        grad_hidden = torch.empty_like(hidden)
        # Each chunk's product is rounded to the compute dtype (as any matmul in it is); the sum over chunks is fp32.
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for start in range(0, hidden.shape[0], ctx.chunk_size):
            window = slice(start, start + ctx.chunk_size)
            h = hidden[window].to(ctx.dtype)
            logits = logits_sampling_utils.scale(h @ w.t(), ctx.sampling)
            # d lp / d logits = (onehot(target) − softmax(logits / T) on the kept tokens) / T, per output column
            g = grad_out[window]
            grad_logits = (logits - lse[window, :1]).exp().mul_(-g[:, :1])
            if ctx.sampling is not None and ctx.sampling.filters:
                keep = logits_sampling_utils.kept_tokens(logits, threshold[window], cutoff[window], targets[window])
                grad_logits.masked_fill_(~keep, 0.0)
            if g.shape[1] == 2:
                grad_logits.sub_((logits - lse[window, 1:]).exp().mul_(g[:, 1:]))
            grad_logits.scatter_add_(-1, targets[window, None], g.sum(dim=-1, keepdim=True))
            grad_logits = grad_logits.div_(temperature).to(ctx.grad_dtype)
            grad_hidden[window] = (grad_logits @ w_grad).to(hidden.dtype)
            grad_weight += (grad_logits.t() @ h.to(ctx.grad_dtype)).float()
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None, None, None, None


def project_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk_size: int,
    dtype: torch.dtype,
    grad_dtype: torch.dtype | None = None,
    sampling: TrainingSamplingParams | None = None,
    also_unfiltered: bool = False,
) -> torch.Tensor:
    """``[N]`` fp32 ``log_softmax(hidden @ weightᵀ)[targets]`` for ``hidden [N, H]``, ``targets [N]``;
    differentiable w.r.t. ``hidden`` and ``weight``. The matmuls run in ``dtype`` (the backward's gradient
    matmuls in ``grad_dtype``, default ``dtype``), the softmax in fp32. ``sampling``/``also_unfiltered``: see
    `_ProjectedTokenLogprobs` (``[N, 2]`` with the latter)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if sampling is not None and sampling.is_identity:
        sampling = None
    return _ProjectedTokenLogprobs.apply(
        hidden, weight, targets.long(), chunk_size, dtype, grad_dtype or dtype, sampling, also_unfiltered
    )


class SelectiveLMHead(nn.Linear):
    """A bias-free ``nn.Linear`` LM head that, inside `selecting`, returns token logprobs instead of logits.

    Installed by class swap (`install`), so parameter names, weight tying and sharding stay those of the model.
    """

    _selection: Selection | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self._selection is None:
            return super().forward(hidden)
        sel = self._selection
        positions = sel.positions.to(hidden.device)
        picked = project_token_logprobs(
            hidden[positions],
            self.weight,
            sel.targets.to(hidden.device)[positions],
            sel.chunk_size,
            sel.dtype,
            sel.grad_dtype,
            sel.sampling,
            sel.also_unfiltered,
        )
        if sel.also_unfiltered:
            out = torch.zeros((*positions.shape, 2), dtype=torch.float32, device=hidden.device)
            out[positions] = picked
            return out
        out = torch.zeros(positions.shape, dtype=torch.float32, device=hidden.device)
        return out.masked_scatter(positions, picked)

    @contextlib.contextmanager
    def selecting(self, selection: Selection) -> Iterator[None]:
        """Within this block the model's ``.logits`` are ``[B, S]`` fp32 logprobs (``[B, S, 2]`` with
        ``also_unfiltered``; layout: module doc)."""
        self._selection = selection
        try:
            yield
        finally:
            self._selection = None


def install(model: PreTrainedModel) -> SelectiveLMHead | None:
    """Turn ``model``'s output embedding into a `SelectiveLMHead`; None when its head is not a plain bias-free
    ``nn.Linear`` or the model post-processes its logits (e.g. Gemma 2's soft-capping), which the shortcut would skip."""
    head = model.get_output_embeddings()
    if type(head) is not nn.Linear or head.bias is not None:
        return None
    if getattr(model.config, "final_logit_softcapping", None):
        return None
    head.__class__ = SelectiveLMHead
    return cast(SelectiveLMHead, head)


def next_token_selection(input_ids: torch.Tensor, wanted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, targets) for the logprobs ``wanted`` ``[B, S - 1]`` (True where log p(input_ids[:, t + 1]) is read)."""
    positions = torch.nn.functional.pad(wanted.bool(), (0, 1))
    targets = torch.nn.functional.pad(input_ids[:, 1:], (0, 1))
    return positions, targets
