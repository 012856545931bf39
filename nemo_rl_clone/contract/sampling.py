"""The distribution the generation engine sampled from, recomputed from the trainer's logits (NeMo-RL v0.7.0 has
it at ``nemo_rl.algorithms.logits_sampling_utils``).

vLLM samples from softmax(z / T) restricted to the top-k tokens and then to the top-p nucleus (renormalised), and
reports the logprob of each sampled token under that processed distribution. A trainer that scores the same tokens
under softmax(z) trains another policy than the one that sampled, and its importance ratios compare two different
distributions; so the policy's ``curr``/``prev`` logprobs are taken under the same processing. The reference policy
and the KL term use the temperature-scaled distribution without the top-k/top-p filter (NeMo-RL v0.7.0's rule).

Rules, as in vLLM's sampler (``apply_top_k_top_p``): top-k keeps every token whose scaled logit is at least the k-th
largest; top-p then keeps the largest tokens while the probability mass strictly above a token (after the top-k
renormalisation) is below p, so the token that crosses p stays and the top token always does. Tokens tied with
the last kept one follow ``tie_rule``: "keep_all" (the default) keeps every one of them, as vLLM's CPU sampler does
at the k-th value (top-p's mass counts them all; at the top-p cut its order among equal values is its sort's);
"lowest_index" keeps, in vocabulary order, only as many as the rules count (exactly k for top-k, and the top-p
nucleus over those k): what vLLM's CUDA kernel ``apply_top_k_top_p_triton`` keeps for top-k. At a top-p cut that
kernel keeps anything from this set to every tie (docs/gpu.md), which neither rule reproduces, so nothing turns
"lowest_index" on. A row is described by a threshold value and a tie cutoff: the tokens above the threshold, and the tokens equal
to it whose vocabulary id is below the cutoff.

A sampled token always counts as kept: the engine kept it, and where the trainer's logits put it a rounding error
below the threshold the difference belongs in the mismatch metrics, not in an infinite logprob.

Shapes: ``logits`` ``[N, V]`` (or ``[N, V / tp]`` for a vocab shard), ``targets`` ``[N]``, thresholds and cutoffs ``[N]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
import torch.distributed as dist

TieRule = Literal["keep_all", "lowest_index"]
NO_TIE_CUTOFF = torch.iinfo(torch.long).max  # "keep_all": every tied token is below it


@dataclass(frozen=True)
class TrainingSamplingParams:
    """The sampler's settings the trainer must reproduce (``policy.generation``'s temperature, top_k, top_p).

    ``top_k`` None or -1: no top-k; ``top_p`` 1.0: no top-p; ``temperature`` 0 means greedy sampling, whose
    logprobs vLLM reports unprocessed, so it acts as 1 here. ``tie_rule``: which tokens tied at the top-k / top-p
    boundary stay (module docstring).
    """

    top_k: int | None = None  # NeMo-RL's field order: top_k, top_p, temperature
    top_p: float = 1.0
    temperature: float = 1.0
    tie_rule: TieRule = "keep_all"

    def __post_init__(self) -> None:
        if self.tie_rule not in get_args(TieRule):
            raise ValueError(f"tie_rule must be one of {get_args(TieRule)}, got {self.tie_rule!r}")

    @classmethod
    def from_generation(cls, generation: Any) -> TrainingSamplingParams:
        """From a ``policy.generation`` section (None: no generation, nothing to reproduce)."""
        if generation is None or generation.temperature == 0:
            return cls()
        top_k = None if generation.top_k in (None, -1, 0) else int(generation.top_k)
        return cls(top_k=top_k, top_p=float(generation.top_p), temperature=float(generation.temperature))

    @property
    def filters(self) -> bool:
        """Whether top-k or top-p removes tokens."""
        return self.top_k is not None or self.top_p < 1.0

    @property
    def is_identity(self) -> bool:
        return self.temperature == 1.0 and not self.filters

    def unfiltered(self) -> TrainingSamplingParams:
        """The temperature alone: the reference policy's and the KL term's distribution."""
        return TrainingSamplingParams(temperature=self.temperature)


def scale(logits: torch.Tensor, params: TrainingSamplingParams | None) -> torch.Tensor:
    """fp32 ``logits / temperature`` (differentiable)."""
    logits = logits.float()
    if params is None or params.temperature == 1.0:
        return logits
    return logits / params.temperature


def threshold_from_candidates(
    candidates: torch.Tensor, params: TrainingSamplingParams, log_normalizer: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(``[N]`` smallest kept scaled logit of each row, ``[N]`` how many tokens equal to it are kept) from
    ``candidates`` ``[N, C]``: scaled logits sorted largest first that include every token the filters keep (the
    whole row, its top-k, or the union of the shards' own nuclei). ``log_normalizer`` ``[N]``: the row's logsumexp
    over the whole vocabulary, needed for top-p without top-k when ``candidates`` is not the whole row. The count is
    `NO_TIE_CUTOFF` under "keep_all"."""
    with torch.no_grad():
        rows, width = candidates.shape
        lowest_index = params.tie_rule == "lowest_index"
        threshold = torch.full((rows,), -torch.inf, device=candidates.device)
        kept_count = torch.full((rows,), width, dtype=torch.long, device=candidates.device)
        kept = candidates
        if params.top_k is not None and params.top_k <= width:
            threshold = candidates[:, params.top_k - 1]
            kept_count.fill_(params.top_k)
            if lowest_index:
                kept = candidates[:, : params.top_k]  # equal values have equal mass: which ties is irrelevant here
            else:
                kept = candidates.masked_fill(candidates < threshold.unsqueeze(-1), -torch.inf)
            log_normalizer = None  # the top-k set is renormalised on its own
        if params.top_p < 1.0:
            norm = kept.logsumexp(dim=-1) if log_normalizer is None else log_normalizer
            probs = (kept - norm.unsqueeze(-1)).exp()
            mass_above = probs.cumsum(dim=-1) - probs
            count = (mass_above < params.top_p).sum(dim=-1).clamp(min=1)
            threshold = torch.maximum(threshold, candidates.gather(-1, (count - 1).unsqueeze(-1)).squeeze(-1))
            kept_count = torch.minimum(kept_count, count)
        if not lowest_index:
            return threshold, torch.full_like(kept_count, NO_TIE_CUTOFF)
        return threshold, kept_count - (candidates > threshold.unsqueeze(-1)).sum(dim=-1)


def tie_cutoff(
    scaled: torch.Tensor,
    threshold: torch.Tensor,
    ties_kept: torch.Tensor,
    vocab_start: int = 0,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """``[N]`` vocabulary id below which the tokens equal to the row's threshold are kept, so that the ``ties_kept``
    lowest ids stay. ``scaled`` ``[N, V]``, or this rank's shard ``[vocab_start, vocab_start + V)`` of ``group``."""
    with torch.no_grad():
        if bool((ties_kept == NO_TIE_CUTOFF).all()):
            return ties_kept
        ties = (scaled == threshold.unsqueeze(-1)).cumsum(dim=-1)
        in_lower_shards = torch.zeros_like(ties_kept)
        if group is not None:
            mine = torch.cat([ties[:, -1], ties.new_tensor([vocab_start])])
            every = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
            dist.all_gather(every, mine, group=group)
            for other in every:
                if other[-1] < vocab_start:
                    in_lower_shards += other[:-1]
        here = (ties_kept - in_lower_shards).clamp(min=0)
        return vocab_start + (ties < here.unsqueeze(-1)).sum(dim=-1) + (here > 0).long()


def keep_boundary(scaled: torch.Tensor, params: TrainingSamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """(threshold, tie cutoff) ``[N]`` of whole rows ``scaled`` ``[N, V]`` (already divided by the temperature)."""
    with torch.no_grad():
        if params.top_k is not None and params.top_k < scaled.shape[-1]:
            candidates = scaled.topk(params.top_k, dim=-1).values  # sorted, largest first: no sort of the row
            if _top_p_counts_every_top_k_tie(params):
                with_ties = int((scaled >= candidates[:, -1:]).sum(dim=-1).max())
                if with_ties > params.top_k:
                    candidates = scaled.topk(with_ties, dim=-1).values
        else:
            candidates = scaled.sort(dim=-1, descending=True).values
        threshold, ties_kept = threshold_from_candidates(candidates, params)
        return threshold, tie_cutoff(scaled, threshold, ties_kept)


def _top_p_counts_every_top_k_tie(params: TrainingSamplingParams) -> bool:
    """Whether top-p's mass is over every token tied at the k-th value ("keep_all" keeps them all), so the
    candidates must hold them all rather than the first k."""
    return params.top_k is not None and params.top_p < 1.0 and params.tie_rule == "keep_all"


def vocab_parallel_keep_boundary(
    scaled: torch.Tensor, params: TrainingSamplingParams, group: dist.ProcessGroup, vocab_start: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`keep_boundary` of rows whose vocabulary is split over ``group`` (``scaled`` ``[N, V / tp]``, this rank's ids
    from ``vocab_start``): each rank offers its own top-k (or its own nucleus under the global normaliser, which
    contains every globally kept token of its shard), the offers are gathered, and the rule runs on their union.
    Only those candidates (and, under "lowest_index", each shard's count of tied tokens) cross ranks."""
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
        candidates = _gathered_offers(local, group)
        if _top_p_counts_every_top_k_tie(params):
            assert params.top_k is not None
            kth = candidates[:, params.top_k - 1 : params.top_k]
            with_ties = (scaled >= kth).sum(dim=-1).max().reshape(1)
            dist.all_reduce(with_ties, op=dist.ReduceOp.MAX, group=group)
            if int(with_ties.item()) > local.shape[-1]:
                candidates = _gathered_offers(scaled.topk(int(with_ties.item()), dim=-1).values, group)
        threshold, ties_kept = threshold_from_candidates(candidates, params, norm)
        return threshold, tie_cutoff(scaled, threshold, ties_kept, vocab_start, group)


def _gathered_offers(local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Every rank's ``local`` ``[N, C]`` candidates, side by side and sorted largest first."""
    offers = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(offers, local.contiguous(), group=group)
    return torch.cat(offers, dim=-1).sort(dim=-1, descending=True).values


def kept_tokens(
    scaled: torch.Tensor, threshold: torch.Tensor, cutoff: torch.Tensor, targets: torch.Tensor, vocab_start: int = 0
) -> torch.Tensor:
    """``[N, V]`` bool: the tokens above the row's threshold, those equal to it with an id below the row's
    ``cutoff``, and the row's target (always kept) when it lies in this shard ``[vocab_start, vocab_start + V)``."""
    ids = torch.arange(vocab_start, vocab_start + scaled.shape[-1], device=scaled.device)
    at_threshold = scaled == threshold.unsqueeze(-1)
    keep = (scaled > threshold.unsqueeze(-1)) | (at_threshold & (ids < cutoff.unsqueeze(-1)))
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
    if group is None:
        threshold, cutoff = keep_boundary(flat, params)
    else:
        threshold, cutoff = vocab_parallel_keep_boundary(flat, params, group, vocab_start)
    keep = kept_tokens(flat, threshold, cutoff, targets.reshape(-1), vocab_start).reshape(scaled.shape)
    return scaled.masked_fill(~keep, -torch.inf)


TOP_K_TOP_P_CHUNK_SIZE = 256  # rows filtered at a time by `apply_top_k_top_p` (NeMo-RL's default)


def need_top_k_or_top_p_filtering(sampling_params: TrainingSamplingParams | None) -> bool:
    """NeMo-RL's test of whether a sampler's settings drop tokens: ``top_k`` set and > 0, or ``top_p`` set and not
    1.0 (None: no settings, False). Reads only ``.top_k`` and ``.top_p``, so NeMo-RL's own params object works."""
    if sampling_params is None:
        return False
    top_k, top_p = sampling_params.top_k, sampling_params.top_p
    return (top_k is not None and top_k > 0) or (top_p is not None and top_p != 1.0)


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: int | None, top_p: float, chunk_size: int | None = TOP_K_TOP_P_CHUNK_SIZE
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """NeMo-RL's filter: ``(filtered, keep)`` for ``logits`` ``[..., V]`` (not divided by a temperature), the dropped
    tokens set to −inf and ``keep`` the bool mask of the kept ones; ``(logits, None)`` when neither filter applies
    (``top_k`` None or ≤ 0, ``top_p`` 1). The rule is this module's (`keep_boundary`, "keep_all" ties); dropped
    tokens get no gradient. ``chunk_size`` rows are filtered at a time (None: all at once)."""
    top_k = top_k if top_k is not None and top_k > 0 else None
    params = TrainingSamplingParams(top_k=top_k, top_p=1.0 if top_p is None else top_p)
    if not need_top_k_or_top_p_filtering(params):
        return logits, None
    rows = logits.detach().float().reshape(-1, logits.shape[-1])
    step = chunk_size or max(rows.shape[0], 1)
    kept = []
    for chunk in rows.split(step):
        threshold, cutoff = keep_boundary(chunk, params)
        # the top token is always kept, so passing it as the target adds nothing to the filters' set
        kept.append(kept_tokens(chunk, threshold, cutoff, chunk.argmax(dim=-1)))
    keep = torch.cat(kept).reshape(logits.shape) if kept else torch.ones_like(logits, dtype=torch.bool)
    return logits.masked_fill(~keep, -torch.inf), keep
