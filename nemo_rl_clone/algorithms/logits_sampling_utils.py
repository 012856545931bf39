"""NeMo-RL v0.7.0's path (``nemo_rl.algorithms.logits_sampling_utils``) of the sampler's processing, which lives in
`nemo_rl_clone.contract.sampling` (a facade: see `nemo_rl_clone.facades`)."""

from nemo_rl_clone.contract.sampling import (
    NO_TIE_CUTOFF,
    TieRule,
    TrainingSamplingParams,
    keep_boundary,
    kept_tokens,
    processed_logits,
    scale,
    threshold_from_candidates,
    tie_cutoff,
    vocab_parallel_keep_boundary,
)

__all__ = [
    "NO_TIE_CUTOFF",
    "TieRule",
    "TrainingSamplingParams",
    "keep_boundary",
    "kept_tokens",
    "processed_logits",
    "scale",
    "threshold_from_candidates",
    "tie_cutoff",
    "vocab_parallel_keep_boundary",
]
