"""The distribution the generation engine sampled from, recomputed from the trainer's logits.

vLLM samples from softmax(z / T) restricted to the top-k tokens and then to the top-p nucleus (renormalised), and
reports the logprob of each sampled token under that processed distribution. A trainer that scores the same tokens
under softmax(z) trains another policy than the one that sampled, and its importance ratios compare two different
distributions; so the policy's ``curr``/``prev`` logprobs are taken under the same processing. The reference policy
and the KL term use the temperature-scaled distribution without the top-k/top-p filter (NeMo-RL v0.7.0's rule).

Rules, as in vLLM's sampler (``apply_top_k_top_p``): top-k keeps every token whose scaled logit is at least the k-th
largest (ties at the boundary stay); top-p then keeps the largest tokens while the probability mass strictly above
a token (after the top-k renormalisation) is below p, so the token that crosses p stays and the top token always
does. Both rules keep "every token at or above a threshold", so a row is described by one threshold value.

A sampled token always counts as kept: the engine kept it, and where the trainer's logits put it a rounding error
below the threshold the difference belongs in the mismatch metrics, not in an infinite logprob.

Shapes: ``logits`` ``[N, V]`` (or ``[N, V / tp]`` for a vocab shard), ``targets`` ``[N]``, thresholds ``[N]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TrainingSamplingParams:
    """The sampler's settings the trainer must reproduce (``policy.generation``'s temperature, top_k, top_p).

    ``top_k`` None or -1: no top-k; ``top_p`` 1.0: no top-p; ``temperature`` 0 means greedy sampling, whose
    logprobs vLLM reports unprocessed, so it acts as 1 here.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0

    @classmethod
    def from_generation(cls, generation: Any) -> TrainingSamplingParams:
        """From a ``policy.generation`` section (None: no generation, nothing to reproduce)."""
        if generation is None or generation.temperature == 0:
            return cls()
        top_k = None if generation.top_k in (None, -1, 0) else int(generation.top_k)
        return cls(float(generation.temperature), top_k, float(generation.top_p))

    @property
    def filters(self) -> bool:
        """Whether top-k or top-p removes tokens."""
        return self.top_k is not None or self.top_p < 1.0

    @property
    def is_identity(self) -> bool:
        return self.temperature == 1.0 and not self.filters

    def unfiltered(self) -> TrainingSamplingParams:
        """The temperature alone: the reference policy's and the KL term's distribution."""
        return TrainingSamplingParams(self.temperature)


def scale(logits: torch.Tensor, params: TrainingSamplingParams | None) -> torch.Tensor:
    """fp32 ``logits / temperature`` (differentiable)."""
    logits = logits.float()
    if params is None or params.temperature == 1.0:
        return logits
    return logits / params.temperature


def threshold_from_candidates(
    candidates: torch.Tensor, params: TrainingSamplingParams, log_normalizer: torch.Tensor | None = None
) -> torch.Tensor:
    """``[N]`` smallest kept scaled logit of each row, from ``candidates`` ``[N, C]``: scaled logits sorted largest
    first that include every token the filters keep (the whole row, its top-k, or the union of the shards' own
    nuclei). ``log_normalizer`` ``[N]``: the row's logsumexp over the whole vocabulary, needed for top-p without top-k
    when ``candidates`` is not the whole row."""
    with torch.no_grad():
        threshold = torch.full(candidates.shape[:1], -torch.inf, device=candidates.device)
        kept = candidates
        if params.top_k is not None and params.top_k <= candidates.shape[-1]:
            threshold = candidates[:, params.top_k - 1]
            kept = candidates.masked_fill(candidates < threshold.unsqueeze(-1), -torch.inf)
            log_normalizer = None  # the top-k set is renormalised on its own
        if params.top_p < 1.0:
            norm = kept.logsumexp(dim=-1) if log_normalizer is None else log_normalizer
            probs = (kept - norm.unsqueeze(-1)).exp()
            mass_above = probs.cumsum(dim=-1) - probs
            count = (mass_above < params.top_p).sum(dim=-1).clamp(min=1)
            threshold = torch.maximum(threshold, candidates.gather(-1, (count - 1).unsqueeze(-1)).squeeze(-1))
        return threshold


def keep_threshold(scaled: torch.Tensor, params: TrainingSamplingParams) -> torch.Tensor:
    """``[N]`` threshold of whole rows ``scaled`` ``[N, V]`` (already divided by the temperature)."""
    with torch.no_grad():
        if params.top_k is not None and params.top_k < scaled.shape[-1]:
            candidates = scaled.topk(params.top_k, dim=-1).values  # sorted, largest first: no sort of the row
        else:
            candidates = scaled.sort(dim=-1, descending=True).values
        return threshold_from_candidates(candidates, params)


def vocab_parallel_keep_threshold(
    scaled: torch.Tensor, params: TrainingSamplingParams, group: dist.ProcessGroup
) -> torch.Tensor:
    """`keep_threshold` of rows whose vocabulary is split over ``group`` (``scaled`` ``[N, V / tp]``): each rank
    offers its own top-k (or its own nucleus under the global normaliser, which contains every globally kept token of
    its shard), the offers are gathered, and the rule runs on their union. Only those candidates cross ranks."""
    with torch.no_grad():
        if params.top_k is not None:
            local = scaled.topk(min(params.top_k, scaled.shape[-1]), dim=-1).values
            norm = None
        else:
            local_max = scaled.max(dim=-1).values
            dist.all_reduce(local_max, op=dist.ReduceOp.MAX, group=group)
            sum_exp = (scaled - local_max.unsqueeze(-1)).exp().sum(dim=-1)
            dist.all_reduce(sum_exp, group=group)
            norm = local_max + sum_exp.log()
            ordered = scaled.sort(dim=-1, descending=True).values
            probs = (ordered - norm.unsqueeze(-1)).exp()
            needed = ((probs.cumsum(dim=-1) - probs) < params.top_p).sum(dim=-1).max().reshape(1).clamp(min=1)
            dist.all_reduce(needed, op=dist.ReduceOp.MAX, group=group)
            local = ordered[:, : int(needed.item())]
        offers = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        dist.all_gather(offers, local.contiguous(), group=group)
        candidates = torch.cat(offers, dim=-1).sort(dim=-1, descending=True).values
        return threshold_from_candidates(candidates, params, norm)


def kept_tokens(
    scaled: torch.Tensor, threshold: torch.Tensor, targets: torch.Tensor, vocab_start: int = 0
) -> torch.Tensor:
    """``[N, V]`` bool: the tokens at or above the row's threshold, and the row's target (always kept) when it lies in
    this shard ``[vocab_start, vocab_start + V)``."""
    keep = scaled >= threshold.unsqueeze(-1)
    local = targets - vocab_start
    in_shard = (local >= 0) & (local < scaled.shape[-1])
    rows = torch.nonzero(in_shard).squeeze(-1)
    keep[rows, local[rows]] = True
    return keep


def processed_logits(
    logits: torch.Tensor,
    targets: torch.Tensor,
    params: TrainingSamplingParams | None,
    group: dist.ProcessGroup | None = None,
    vocab_start: int = 0,
) -> torch.Tensor:
    """fp32 ``logits`` ``[N, V]`` (or a vocab shard) divided by the temperature, with the tokens the top-k/top-p
    filters drop set to −inf (``targets`` ``[N]`` always kept): their log-softmax is the sampled distribution's.
    Differentiable; the dropped tokens get no gradient."""
    scaled = scale(logits, params)
    if params is None or not params.filters:
        return scaled
    flat = scaled.detach().reshape(-1, scaled.shape[-1])
    threshold = keep_threshold(flat, params) if group is None else vocab_parallel_keep_threshold(flat, params, group)
    keep = kept_tokens(flat, threshold, targets.reshape(-1), vocab_start).reshape(scaled.shape)
    return scaled.masked_fill(~keep, -torch.inf)
