"""Losses for GRPO/PPO (`ClippedPGLossFn`, here), SFT (`NLLLossFn`), DPO (`DPOLossFn`) and reward models
(`PreferenceLossFn`; those three in `supervised`), all importable from this module, NeMo-RL's path.

Call contract (NeMo-RL's), shared by all four:

    loss, metrics = loss_fn(next_token_logits, data, global_valid_seqs, global_valid_toks,
                            vocab_parallel_rank=None, vocab_parallel_group=None, context_parallel_group=None,
                            logprob_chunk_size=None)

- `next_token_logits`: [B, S, V] (position t predicts token t+1), or this rank's vocab shard when
  `vocab_parallel_group` is given. `PreferenceLossFn` takes the [B, 1] scores of a classification head instead.
- `data`: a dict or `BatchedDataDict` of [B, S] / [B] tensors. [B, S] logprob tensors follow the policy's layout (position i
  holds log p(token_i | tokens_<i), position 0 is 0), so the losses use their `[:, 1:]`, aligned with the
  [B, S-1] logprobs computed here. The trainable-token mask is m = token_mask[:, 1:] * sample_mask[:, None].
- `global_valid_toks` / `global_valid_seqs`: Σ m and Σ sample_mask over the *whole global batch* — all microbatches
  on all data-parallel ranks (`nemo_rl_clone.distributed.model_utils.valid_counts`). Each call returns its
  microbatch's *share*: Σ(per-token or per-sequence loss) / global count. Summing the returned losses over the
  microbatches of one optimizer step and over DP ranks gives the global mean, whatever the number of workers;
  gradients accumulate the same way (the DP all-reduce must *sum*, not average).
- `metrics`: python numbers normalised the same way (microbatch sum / global count), so the trainer *sums* each
  metric over the microbatches of one global batch and over DP ranks to get its global value; counts
  (`num_valid_samples`, `num_unmasked_tokens`) are local counts and sum to global counts too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor as Tensor  # NeMo-RL's module offers it too

from nemo_rl_clone.algorithms.loss.common import Metrics, masked_diff, masks, require_keys, shifted
from nemo_rl_clone.algorithms.loss.configs import (
    ClippedPGLossConfig,
    ClippedPGLossDataDict,
    DPOLossConfig,
    DPOLossDataDict,
    PreferenceLossDataDict,
    as_loss_config,
)
from nemo_rl_clone.algorithms.loss.distillation import (
    DistillationLossConfig,
    DistillationLossDataDict,
    DistillationLossFn,
)
from nemo_rl_clone.algorithms.loss.supervised import DPOLossFn, NLLLossFn, PreferenceLossFn
from nemo_rl_clone.algorithms.utils import calculate_kl, masked_mean
from nemo_rl_clone.contract.loss import LossType, TokenLogprobs
from nemo_rl_clone.contract.loss_input import policy_logprobs
from nemo_rl_clone.contract.sampling import TrainingSamplingParams
from nemo_rl_clone.utils.lazy_exports import lazy_getattr
from nemo_rl_clone.utils.unsupported_modules import refusing_getattr

__all__ = [
    "ClippedPGLossConfig",
    "ClippedPGLossDataDict",
    "ClippedPGLossFn",
    "DPOLossConfig",
    "DPOLossDataDict",
    "DPOLossFn",
    "DistillationLossConfig",
    "DistillationLossDataDict",
    "DistillationLossFn",
    "LossType",
    "NLLLossFn",
    "PreferenceLossDataDict",
    "PreferenceLossFn",
    "calculate_kl",
]


# vocab_parallel_rank, vocab_parallel_group, context_parallel_group, logprob_chunk_size of the call contract
_ParallelArgs = tuple[int | None, dist.ProcessGroup | None, dist.ProcessGroup | None, int | None]


def _js_divergence(lp_a: torch.Tensor, lp_b: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of JS(P_a ‖ P_b): ½·k3(P_a ‖ M) + ½·k3(P_b ‖ M) with M = ½(P_a + P_b)."""
    a = torch.where(valid, lp_a, 0.0)
    b = torch.where(valid, lp_b, 0.0)
    log_mix = torch.logaddexp(a, b) - torch.log(torch.tensor(2.0, device=a.device))
    return 0.5 * (calculate_kl(log_mix, a, "k3", None, None) + calculate_kl(log_mix, b, "k3", None, None))


class ClippedPGLossFn:
    """Clipped policy-gradient loss with a KL penalty: PPO / GRPO / DAPO clip-higher / dual clip / GSPO / REINFORCE.

    Per trainable token (lp = current, lp_prev = `prev_logprobs`, lp_gen = `generation_logprobs`):
      r = exp(lp − lp_prev); L = max(−A·r, −A·clip(r, 1 − ratio_clip_min, 1 + ratio_clip_max));
      dual clip (ratio_clip_c = c): L = min(L, −A·c) where A < 0;
      `disable_ppo_ratio` (REINFORCE/RLOO): L = −A·lp;
      `use_cispo` (CISPO): L = −sg(clip(r, 1 − ratio_clip_min, 1 + ratio_clip_max))·A·lp;
      GSPO (`sequence_level_importance_ratios`): r = exp(mean over the sequence's tokens of (lp − lp_prev)).
    Importance-sampling correction (`use_importance_sampling_correction`): L ← w·L with the detached
      w = exp(lp_prev − lp_gen) (per sequence with GSPO: exp(Σ_t (lp_prev − lp_gen))); NaN/inf → 0. With
      `truncated_importance_sampling_ratio` = hi (and `..._ratio_min` = lo): "tis" clamps w at hi; "icepop" zeroes
      tokens with w ∉ [lo, hi]; "seq-mask-tis" zeroes sequences whose geometric-mean w ∉ [lo, hi].
    KL: β·clamp(w·k, ±`kl_output_clamp_value`) with the `reference_policy_kl_type` estimator k (`calculate_kl`: k1,
      k2 or k3 of d = lp_ref − lp, d clamped at ±`kl_input_clamp_value`), β = `reference_policy_kl_penalty`, and the
      weight w = exp(lp − sg(lp)) (value 1) that keeps the score-function term of the gradient, so its expectation
      is ∇E_π[k]: ∇KL(π ‖ π_ref) for k1 and k3 (both unbiased), ∇E_π[½·d²] for k2 (arXiv 2506.09477; NeMo-RL
      v0.7.0). A token where either clamp binds gets no gradient from the penalty (w is detached there). With
      `use_on_policy_kl_approximation`, w = exp(lp − lp_gen) undetached, so the penalty and its gradient estimate
      those under π although the tokens came from π_gen. With the sampler's top-k/top-p, lp here is the
      temperature-only logprob (`sampling_params`).
    Normalisation: `token_level_loss=true`: Σ(L + kl)·m / global_valid_toks; false: per-sequence token mean,
      summed over valid sequences / global_valid_seqs.

    Metrics (shares of global means, see the module doc; `loss` and `kl_penalty` use the loss's normalisation,
    the others the token count): `loss`; `probs_ratio` and
    `probs_ratio_clamped` (r and its clip; with `disable_ppo_ratio` both are the unclipped exp(lp − lp_prev));
    `kl_penalty` (the KL term without β; 0 when β = 0); `token_mult_prob_error` (exp|lp_gen − lp_prev|, 1 when the
    trainer and the generator agree); `gen_kl_error` (the KL estimator, unclamped, with d = lp_prev − lp_gen: an
    estimate of KL(π_gen ‖ π_prev) from the generator's samples); `policy_kl_error` (the same with d = lp_gen −
    lp_prev); `js_divergence_error` (k3 estimate of their Jensen-Shannon divergence); `sampling_importance_ratio`
    (mean w after truncation); `is_oob_ratio` (icepop / seq-mask-tis only: share of tokens / sequences zeroed); `approx_entropy` (−exp(lp − lp_gen)·lp: the entropy of π
    estimated from π_gen's samples); `num_valid_samples` (local Σ sample_mask).

    Data keys: input_ids, token_mask, sample_mask, advantages, prev_logprobs, generation_logprobs, and
    reference_policy_logprobs when β ≠ 0.
    """

    accepts_token_logprobs = True  # reads the logits only as next-token logprobs at token_mask positions

    def __init__(
        self,
        cfg: Mapping[str, Any] | ClippedPGLossConfig | None = None,
        sampling_params: TrainingSamplingParams | None = None,
    ) -> None:
        self.cfg = as_loss_config(ClippedPGLossConfig, cfg, "ClippedPGLossFn")
        self.loss_type = LossType.TOKEN_LEVEL if self.cfg.token_level_loss else LossType.SEQUENCE_LEVEL
        # The sampler's processing: lp (ratios, entropy) is taken under it, the KL term under its temperature alone.
        self.sampling_params = sampling_params
        self.needs_unfiltered_logprobs = (
            sampling_params is not None and sampling_params.filters and self.cfg.uses_reference_kl
        )

    def __call__(
        self,
        next_token_logits: torch.Tensor | TokenLogprobs,
        data: Mapping[str, Any],
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
        vocab_parallel_rank: int | None = None,
        vocab_parallel_group: dist.ProcessGroup | None = None,
        context_parallel_group: dist.ProcessGroup | None = None,
        logprob_chunk_size: int | None = None,
    ) -> tuple[torch.Tensor, Metrics]:
        cfg = self.cfg
        require_keys(data, self._required_keys(), type(self).__name__)
        parallel = (vocab_parallel_rank, vocab_parallel_group, context_parallel_group, logprob_chunk_size)
        lp, kl_lp = self._policy_and_kl_logprobs(next_token_logits, data, parallel)
        token_mask, sample_mask, mask = masks(data, lp)
        valid = mask > 0
        advantages = torch.where(valid, shifted(data, "advantages", lp), 0.0)
        gen_lp = shifted(data, "generation_logprobs", lp)
        prev_lp = lp.detach() if cfg.force_on_policy_ratio else shifted(data, "prev_logprobs", lp)

        ratio, clamped_ratio, per_token = self._policy_gradient_terms(lp, prev_lp, advantages, valid, mask)
        is_weights, filter_metrics = self._importance_weights(
            prev_lp, gen_lp, valid, token_mask, mask, global_valid_toks, sample_mask, global_valid_seqs
        )
        if cfg.use_importance_sampling_correction:
            per_token = per_token * is_weights
        kl_per_token = self._reference_kl_terms(data, lp, kl_lp, gen_lp, valid)

        actor_loss = self._reduce(per_token, token_mask, sample_mask, mask, global_valid_seqs, global_valid_toks)
        kl = self._reduce(kl_per_token, token_mask, sample_mask, mask, global_valid_seqs, global_valid_toks)
        loss = actor_loss + cfg.reference_policy_kl_penalty * kl

        with torch.no_grad():

            def token_metric(values: torch.Tensor) -> float:
                return masked_mean(values, mask, global_normalization_factor=global_valid_toks).item()

            lp_detached = lp.detach()
            gen_gap = masked_diff(gen_lp, prev_lp, valid)
            metrics: Metrics = {
                "loss": loss.item(),
                "probs_ratio": token_metric(ratio.detach()),
                "probs_ratio_clamped": token_metric(clamped_ratio.detach()),
                "kl_penalty": kl.item(),
                "token_mult_prob_error": token_metric(gen_gap.abs().exp()),
                "gen_kl_error": token_metric(self._kl(gen_lp, torch.where(valid, prev_lp, gen_lp), clamp=False)),
                "policy_kl_error": token_metric(self._kl(prev_lp, torch.where(valid, gen_lp, prev_lp), clamp=False)),
                "js_divergence_error": token_metric(_js_divergence(prev_lp, gen_lp, valid)),
                "approx_entropy": token_metric(-masked_diff(lp_detached, gen_lp, valid).exp() * lp_detached),
                "sampling_importance_ratio": (
                    masked_mean(is_weights.squeeze(-1), sample_mask, global_normalization_factor=global_valid_seqs)
                    if cfg.sequence_level_importance_ratios
                    else masked_mean(is_weights, mask, global_normalization_factor=global_valid_toks)
                ).item(),
                "num_valid_samples": sample_mask.sum().item(),
                **filter_metrics,
            }
        return loss, metrics

    def _required_keys(self) -> tuple[str, ...]:
        cfg = self.cfg
        keys: tuple[str, ...] = ("input_ids", "token_mask", "sample_mask", "advantages", "generation_logprobs")
        keys += () if cfg.force_on_policy_ratio else ("prev_logprobs",)
        keys += ("reference_policy_logprobs",) if cfg.uses_reference_kl else ()
        return keys

    def _policy_and_kl_logprobs(
        self, next_token_logits: torch.Tensor | TokenLogprobs, data: Mapping[str, Any], parallel: _ParallelArgs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(lp, the KL term's lp)``: the same tensor unless top-k/top-p filter the sampled distribution."""
        lp = policy_logprobs(next_token_logits, data, *parallel, self.sampling_params)
        kl_lp = lp
        if self.needs_unfiltered_logprobs:
            assert self.sampling_params is not None
            kl_lp = policy_logprobs(next_token_logits, data, *parallel, self.sampling_params.unfiltered())
        return lp, kl_lp

    def _policy_gradient_terms(
        self,
        lp: torch.Tensor,
        prev_lp: torch.Tensor,
        advantages: torch.Tensor,
        valid: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(ratio, clamped ratio, per-token loss L)`` of the configured variant (see the class doc)."""
        cfg = self.cfg
        log_ratio = masked_diff(lp, prev_lp, valid)
        if cfg.disable_ppo_ratio:
            ratio = clamped_ratio = log_ratio.detach().exp()
            per_token = -advantages * torch.where(valid, lp, 0.0)
        elif cfg.use_cispo:
            ratio = log_ratio.exp()
            clamped_ratio = ratio.clamp(1.0 - cfg.ratio_clip_min, 1.0 + cfg.ratio_clip_max)
            per_token = -advantages * clamped_ratio.detach() * torch.where(valid, lp, 0.0)
        else:
            if cfg.sequence_level_importance_ratios:
                ratio = masked_mean(log_ratio, mask, dim=-1).exp().unsqueeze(-1).expand_as(lp)
            else:
                ratio = log_ratio.exp()
            clamped_ratio = ratio.clamp(1.0 - cfg.ratio_clip_min, 1.0 + cfg.ratio_clip_max)
            per_token = torch.maximum(-advantages * ratio, -advantages * clamped_ratio)
            if cfg.ratio_clip_c is not None:
                dual_bound = -advantages * cfg.ratio_clip_c
                per_token = torch.where(advantages < 0, torch.minimum(per_token, dual_bound), per_token)
        return ratio, clamped_ratio, per_token

    def _reference_kl_terms(
        self,
        data: Mapping[str, Any],
        lp: torch.Tensor,
        kl_lp: torch.Tensor,
        gen_lp: torch.Tensor,
        valid: torch.Tensor,
    ) -> torch.Tensor:
        """Per-token KL penalty against the reference policy (zeros without a KL term)."""
        cfg = self.cfg
        kl_per_token = torch.zeros_like(lp)
        if cfg.uses_reference_kl:
            ref_lp = shifted(data, "reference_policy_logprobs", lp)
            # The tokens were sampled from the policy being optimised, so the penalty's gradient needs the
            # score-function term k·∇lp besides the pathwise ∇k (arXiv 2506.09477): a weight of value 1 that carries
            # it, exp(lp − sg(lp)); or, under the on-policy approximation, the undetached exp(lp − lp_gen).
            # `calculate_kl` applies it inside its clamps, so a clamped token gets no gradient (NeMo-RL v0.7.0).
            anchor = gen_lp if cfg.use_on_policy_kl_approximation else kl_lp.detach()
            weight = torch.nan_to_num(masked_diff(kl_lp, anchor, valid).exp(), nan=0.0, posinf=0.0, neginf=0.0)
            kl_per_token = self._kl(kl_lp, torch.where(valid, ref_lp, kl_lp.detach()), weight)
        return kl_per_token

    def rows_with_gradient(self, data: Mapping[str, Any]) -> torch.Tensor | None:
        """[B] bool: the rows whose terms can be non-zero; the others' loss, gradient and share of the loss are
        exactly 0 (every variant above multiplies each token's term by its advantage, and m zeroes masked rows), so a
        trainer may leave them out if it keeps the whole batch's normalisation. None (train every row) with a KL
        term, whose gradient does not vanish with the advantage, or with ``train_only_samples_with_gradient: false``.
        """
        if not self.cfg.train_only_samples_with_gradient or self.cfg.uses_reference_kl:
            return None
        token_mask = data["token_mask"][:, 1:] != 0
        advantage = data["advantages"][:, 1:]
        return (data["sample_mask"] != 0) & ((advantage != 0) & token_mask).any(dim=-1)

    def _kl(
        self, lp: torch.Tensor, ref_lp: torch.Tensor, weight: torch.Tensor | None = None, clamp: bool = True
    ) -> torch.Tensor:
        cfg = self.cfg
        if not clamp:
            return calculate_kl(lp, ref_lp, cfg.reference_policy_kl_type, None, None)
        kind, low, high = cfg.reference_policy_kl_type, cfg.kl_input_clamp_value, cfg.kl_output_clamp_value
        return calculate_kl(lp, ref_lp, kind, low, high, importance_sampling_weights=weight)

    def _importance_weights(
        self,
        prev_lp: torch.Tensor,
        gen_lp: torch.Tensor,
        valid: torch.Tensor,
        token_mask: torch.Tensor,
        mask: torch.Tensor,
        global_valid_toks: torch.Tensor,
        sample_mask: torch.Tensor,
        global_valid_seqs: torch.Tensor,
    ) -> tuple[torch.Tensor, Metrics]:
        """Detached off-policy weights π_prev/π_gen, [B, S-1] (or [B, 1] with GSPO), after truncation, and the
        truncation's `is_oob_ratio` metric (share of tokens, or of sequences, it zeroed) for icepop / seq-mask-tis."""
        cfg = self.cfg
        log_weight = masked_diff(prev_lp, gen_lp, valid)
        if cfg.sequence_level_importance_ratios:
            log_weight = log_weight.sum(dim=-1, keepdim=True)
        weights = torch.nan_to_num(log_weight.exp(), nan=0.0, posinf=0.0, neginf=0.0)
        high, low = cfg.truncated_importance_sampling_ratio, cfg.truncated_importance_sampling_ratio_min
        kind = cfg.truncated_importance_sampling_type or "tis"
        metrics: Metrics = {}
        if high is None:
            pass
        elif kind == "tis":
            weights = weights.clamp(max=high)
        elif kind == "icepop":
            assert low is not None  # ClippedPGLossConfig.check requires it with this type
            kept = ((weights >= low) & (weights <= high)).float()
            metrics["is_oob_ratio"] = masked_mean(1 - kept, mask, global_normalization_factor=global_valid_toks).item()
            weights = weights * kept
        else:  # seq-mask-tis: sequences whose geometric-mean weight is out of bounds train nothing
            assert low is not None  # as above
            geo_mean = masked_mean(log_weight, token_mask, dim=-1).exp()
            kept = ((geo_mean >= low) & (geo_mean <= high)).float()
            metrics["is_oob_ratio"] = masked_mean(
                1 - kept, sample_mask, global_normalization_factor=global_valid_seqs
            ).item()
            weights = weights * kept.unsqueeze(-1)
        return weights.detach(), metrics

    def _reduce(
        self,
        per_token: torch.Tensor,
        token_mask: torch.Tensor,
        sample_mask: torch.Tensor,
        mask: torch.Tensor,
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
    ) -> torch.Tensor:
        if self.loss_type == LossType.TOKEN_LEVEL:
            return masked_mean(per_token, mask, global_normalization_factor=global_valid_toks)
        per_sequence = masked_mean(per_token, token_mask, dim=-1)
        return masked_mean(per_sequence, sample_mask, global_normalization_factor=global_valid_seqs)


_DRAFT = "training a speculative-decoding (EAGLE) draft model"
_XTOKEN = "off-policy (cross-tokenizer) distillation from a teacher's stored outputs"
_refused = refusing_getattr(
    __name__,
    {
        **dict.fromkeys(
            ("DraftCrossEntropyLossConfig", "DraftCrossEntropyLossDataDict", "DraftCrossEntropyLossFn"), _DRAFT
        ),
        **dict.fromkeys(
            (
                "CrossTokenizerDistillationLossConfig",
                "CrossTokenizerDistillationLossDataDict",
                "CrossTokenizerDistillationLossFn",
            ),
            _XTOKEN,
        ),
    },
)
# PPO's critic loss lives with PPO, which imports this package: loaded on first use
_ppo_value_loss = lazy_getattr(
    "nemo_rl_clone.algorithms.ppo", {"MseValueLossFn": "value_loss", "MseValueLossConfig": "config"}
)


def __getattr__(name: str) -> Any:
    if name in ("MseValueLossFn", "MseValueLossConfig"):
        return _ppo_value_loss(name)
    return _refused(name)
