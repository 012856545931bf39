"""Typed configs of the losses in `loss_functions` (NeMo-RL's keys and defaults), checked by `validate_config`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, TypeVar

import torch

from nemo_rl_clone.utils.config_validation import ConfigError, SectionReads, as_config


@dataclass(frozen=True)
class ClippedPGLossConfig(SectionReads):
    """`loss_fn` section of a GRPO config (NeMo-RL's keys and defaults)."""

    reference_policy_kl_penalty: float = 0.01  # β of the KL-to-reference term; 0: no term and no reference pass
    reference_policy_kl_type: Literal["k1", "k2", "k3"] = "k3"  # the KL estimator of d = lp_ref − lp
    # Bounds on |log π_ref − log π| before the KL estimator and on the estimator's value (null: unbounded).
    kl_input_clamp_value: float | None = 20.0
    kl_output_clamp_value: float | None = 10.0  # bound on the estimate (the clamp above's second half)
    ratio_clip_min: float = 0.2  # the ratio is clipped at 1 − ratio_clip_min below
    ratio_clip_max: float = 0.2  # and at 1 + ratio_clip_max above (DAPO's clip-higher: larger)
    # Dual clip: a negative-advantage token's loss is at most −A·c (c > 1); null: off.
    ratio_clip_c: float | None = None
    # The KL term's weight is exp(lp − lp_gen) (the tokens came from the generator), not exactly 1.
    use_on_policy_kl_approximation: bool = False
    use_importance_sampling_correction: bool = False  # each token's loss × exp(lp_prev − lp_gen), detached
    truncated_importance_sampling_ratio: float | None = None  # the upper bound on that weight; null: none
    # What the truncation does with weights outside [ratio_min, ratio]: "tis" clamps above; "icepop" zeroes tokens;
    # "seq-mask-tis" zeroes whole sequences by their geometric-mean weight. null means "tis".
    truncated_importance_sampling_type: Literal["tis", "icepop", "seq-mask-tis"] | None = None
    truncated_importance_sampling_ratio_min: float | None = None  # the lower bound of icepop / seq-mask-tis
    sequence_level_importance_ratios: bool = False  # GSPO: one ratio per sequence (needs token_level_loss false)
    token_level_loss: bool = True  # the mean over the batch's tokens; false: each sequence's token mean, averaged
    disable_ppo_ratio: bool = False  # REINFORCE / RLOO: L = −A·lp, no ratio or clipping
    # lp_prev := stop-grad(lp). Exact when each rollout batch gets one optimizer step (on-policy), and it spares the
    # trainer a logprob pass per step; `prev_logprobs` is then not needed.
    force_on_policy_ratio: bool = False
    # CISPO (MiniMax-M1): L = −sg(clip(r, 1 − ratio_clip_min, 1 + ratio_clip_max))·A·lp.
    use_cispo: bool = False
    positive_example_nll_weight: float = 0.0  # VAPO's NLL term on positive examples: only 0
    use_kl_in_reward: bool = False  # the KL as a reward penalty: only false (it is a loss term here)
    # Ours: the training pass leaves out samples whose every term is zero (advantage 0 on all their tokens, or
    # sample_mask 0) while dividing by the whole batch's counts, so the gradient is unchanged. Only without a KL term,
    # whose gradient does not vanish with the advantage; false trains every sample (docs/grpo.md).
    train_only_samples_with_gradient: bool = True

    @property
    def uses_reference_kl(self) -> bool:
        """Whether the loss has a KL term, and so reads ``reference_policy_logprobs``: a non-zero coefficient
        (NeMo-RL's rule; `check` refuses negative ones)."""
        return self.reference_policy_kl_penalty != 0

    def check(self) -> list[tuple[str, str]]:
        """(key, message) for every impossible value or combination; types are checked by `validate_config`."""
        problems = []
        for key in ("ratio_clip_min", "ratio_clip_max", "reference_policy_kl_penalty"):
            if getattr(self, key) < 0:
                problems.append((key, f"must be >= 0, got {getattr(self, key)}"))
        for key in ("kl_input_clamp_value", "kl_output_clamp_value"):
            if getattr(self, key) is not None and getattr(self, key) <= 0:
                problems.append((key, f"must be > 0 or null, got {getattr(self, key)}"))
        if self.ratio_clip_c is not None and self.ratio_clip_c <= 1:
            problems.append(
                ("ratio_clip_c", f"must be > 1 (dual-clip bound on the ratio) or null, got {self.ratio_clip_c}")
            )
        problems += self._check_truncation()
        if self.sequence_level_importance_ratios and self.token_level_loss:
            problems.append(("sequence_level_importance_ratios", "GSPO (true) needs token_level_loss=false"))
        if self.use_cispo:
            for key in ("disable_ppo_ratio", "sequence_level_importance_ratios", "force_on_policy_ratio"):
                if getattr(self, key):
                    problems.append(("use_cispo", f"CISPO clips the token ratio itself; set {key}=false"))
            if self.ratio_clip_c is not None:
                problems.append(("ratio_clip_c", "dual clipping does not apply to CISPO's loss; set it to null"))
            if not self.token_level_loss:
                problems.append(("use_cispo", "CISPO needs token_level_loss=true"))
        if self.disable_ppo_ratio and self.ratio_clip_c is not None:
            problems.append(("ratio_clip_c", "dual clipping bounds the PPO ratio, which disable_ppo_ratio removes"))
        if self.positive_example_nll_weight != 0:
            problems.append(
                (
                    "positive_example_nll_weight",
                    "not supported yet: VAPO's NLL term on positive examples; set it to 0.0",
                )
            )
        if self.use_kl_in_reward:
            problems.append(
                (
                    "use_kl_in_reward",
                    "not supported yet: the KL penalty is a loss term here (reference_policy_kl_penalty); set it to "
                    "false",
                )
            )
        return problems

    def _check_truncation(self) -> list[tuple[str, str]]:
        tis, low, kind = (
            self.truncated_importance_sampling_ratio,
            self.truncated_importance_sampling_ratio_min,
            self.truncated_importance_sampling_type,
        )
        problems = []
        if tis is not None and tis <= 0:
            problems.append(("truncated_importance_sampling_ratio", f"must be > 0 or null, got {tis}"))
        if tis is not None and not self.use_importance_sampling_correction:
            problems.append(("truncated_importance_sampling_ratio", "needs use_importance_sampling_correction=true"))
        # NeMo-RL's recipes carry type 'tis' with no ratio (inactive); the masking types without one are refused.
        if kind in ("icepop", "seq-mask-tis") and tis is None:
            problems.append(
                ("truncated_importance_sampling_type", f"{kind!r} needs truncated_importance_sampling_ratio (> 0)")
            )
        if kind in ("icepop", "seq-mask-tis") and tis is not None:
            if low is None:
                problems.append(("truncated_importance_sampling_ratio_min", f"required with type {kind!r}"))
            elif not 0 <= low <= tis:
                problems.append(
                    (
                        "truncated_importance_sampling_ratio_min",
                        f"must be in [0, truncated_importance_sampling_ratio={tis}], got {low}",
                    )
                )
        if low is not None and (tis is None or kind not in ("icepop", "seq-mask-tis")):
            problems.append(
                (
                    "truncated_importance_sampling_ratio_min",
                    "only used by truncated_importance_sampling_type 'icepop' or 'seq-mask-tis' with "
                    "truncated_importance_sampling_ratio set; set it to null",
                )
            )
        if kind == "seq-mask-tis" and self.sequence_level_importance_ratios:
            problems.append(
                ("truncated_importance_sampling_type", "'seq-mask-tis' needs sequence_level_importance_ratios=false")
            )
        return problems


@dataclass(frozen=True)
class DPOLossConfig:
    """`dpo` loss keys of a DPO config (NeMo-RL's names and defaults)."""

    reference_policy_kl_penalty: float = 0.05
    preference_loss_weight: float = 1.0  # the DPO term's weight
    sft_loss_weight: float = 0.0  # the weight of an NLL term on the chosen responses
    preference_average_log_probs: bool = False  # each row's reward is its token mean of lp − lp_ref, not the sum
    sft_average_log_probs: bool = False  # the NLL term is the chosen row's token mean, not the sum

    def check(self) -> list[tuple[str, str]]:
        """(key, message) for every impossible value; types are checked by `validate_config`."""
        problems = []
        if self.reference_policy_kl_penalty <= 0:
            beta = self.reference_policy_kl_penalty
            problems.append(("reference_policy_kl_penalty", f"must be > 0 (the DPO β), got {beta}"))
        for key in ("preference_loss_weight", "sft_loss_weight"):
            if getattr(self, key) < 0:
                problems.append((key, f"must be >= 0, got {getattr(self, key)}"))
        return problems


class ClippedPGLossDataDict(TypedDict):
    """The batch keys `ClippedPGLossFn` reads (NeMo-RL's name); ``reference_policy_logprobs`` only with a KL term."""

    input_ids: torch.Tensor
    advantages: torch.Tensor
    prev_logprobs: torch.Tensor
    generation_logprobs: torch.Tensor
    reference_policy_logprobs: torch.Tensor
    token_mask: torch.Tensor
    sample_mask: torch.Tensor


class PreferenceLossDataDict(TypedDict):
    """The batch keys of a preference batch (NeMo-RL's name): rows interleave chosen / rejected."""

    input_ids: torch.Tensor
    token_mask: torch.Tensor
    sample_mask: torch.Tensor


class DPOLossDataDict(TypedDict):
    """The batch keys `DPOLossFn` reads (NeMo-RL's name)."""

    input_ids: torch.Tensor
    reference_policy_logprobs: torch.Tensor
    token_mask: torch.Tensor
    sample_mask: torch.Tensor


__all__ = [
    "ClippedPGLossConfig",
    "ClippedPGLossDataDict",
    "DPOLossConfig",
    "DPOLossDataDict",
    "PreferenceLossDataDict",
]


_Config = TypeVar("_Config")


def as_loss_config(schema: type[_Config], cfg: Mapping[str, Any] | _Config | None, owner: str) -> _Config:
    """`cfg` as a `schema` for a loss function's constructor. The dataclass is used as is (it was validated where the
    config was loaded); None gives the defaults; a NeMo-RL config mapping or an OmegaConf DictConfig goes through
    `as_config`, missing keys taking the defaults.

    Raises one ValueError listing every unknown key (with the nearest valid name), wrong type and impossible
    combination of a mapping, one line each.
    """
    if cfg is None:
        return schema()
    if not isinstance(cfg, (schema, Mapping)):
        raise TypeError(f"{owner} config must be a mapping or {schema.__name__}, got {type(cfg).__name__}")
    try:
        return as_config(cfg, schema)
    except ConfigError as error:
        raise ValueError(f"invalid {owner} config:\n" + "\n".join(f"  {line}" for line in error.problems)) from None
