"""NeMo-RL v0.7.0's path (``nemo_rl.algorithms.logits_sampling_utils``) of the sampler's processing, which lives in
`nemo_rl_clone.contract.sampling` (a facade: see `nemo_rl_clone.facades`)."""

from nemo_rl_clone.contract.sampling import (
    NO_TIE_CUTOFF,
    TOP_K_TOP_P_CHUNK_SIZE,
    TieRule,
    TrainingSamplingParams,
    apply_top_k_top_p,
    keep_boundary,
    kept_tokens,
    need_top_k_or_top_p_filtering,
    processed_logits,
    scale,
    threshold_from_candidates,
    tie_cutoff,
    vocab_parallel_keep_boundary,
)

__all__ = [
    "NO_TIE_CUTOFF",
    "TOP_K_TOP_P_CHUNK_SIZE",
    "TieRule",
    "TrainingSamplingParams",
    "apply_top_k_top_p",
    "keep_boundary",
    "kept_tokens",
    "need_top_k_or_top_p_filtering",
    "processed_logits",
    "scale",
    "threshold_from_candidates",
    "tie_cutoff",
    "vocab_parallel_keep_boundary",
]
