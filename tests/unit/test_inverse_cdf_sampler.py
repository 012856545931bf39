"""The inverse-CDF sampler's draw (`sample_inverse_cdf`) against an independent computation.

The reference is the definition: the first token whose fp64 cumulative probability (a plain running sum over the
whole vocabulary, no blocks) reaches u × total. The sampler must pick it for every u not within rounding of a
boundary; then, over many uniforms, its frequencies must match the probabilities (chi-square), tokens of probability 0
must never come out, and a seeded generator must give the same draws again.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nemo_rl_clone.models.generation.config import VllmConfig
from nemo_rl_clone.models.generation.vllm.engine_io import engine_sampler
from nemo_rl_clone.models.generation.vllm.inverse_cdf_sampler import BLOCK, sample_inverse_cdf, uniforms

BOUNDARY_SLACK = 1e-9  # u × total this close to a cumulative sum may fall either side by fp32/fp64 rounding


def reference_draws(probs: torch.Tensor, u: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the first index whose running fp64 sum reaches u × total; and whether u × total sits within
    `BOUNDARY_SLACK` of some running sum (where either neighbour is a correct answer)."""
    cdf = np.cumsum(probs.double().numpy(), axis=1)
    targets = u.double().numpy()[:, 0] * cdf[:, -1]
    picks = np.array([int(np.argmax(row >= t)) for row, t in zip(cdf, targets, strict=True)])
    near = np.array([np.min(np.abs(row - t)) < BOUNDARY_SLACK for row, t in zip(cdf, targets, strict=True)])
    return picks, near


def masked_probs(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Softmax rows over ``vocab`` with a third of the tokens (including the first and the last) at probability 0,
    as top-k / top-p leave them."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=generator) * 3
    logits[:, ::3] = float("-inf")
    logits[:, -1] = float("-inf")
    return logits.softmax(-1)


@pytest.mark.parametrize("vocab", [BLOCK * 3, BLOCK * 2 + 37, 50])  # whole blocks, a padded last block, one block
def test_each_draw_is_the_first_token_whose_cumulative_probability_reaches_u(vocab: int) -> None:
    probs = masked_probs(64, vocab, seed=vocab)
    generator = torch.Generator().manual_seed(1)
    for _ in range(20):
        u = 1.0 - torch.rand(64, 1, dtype=torch.float64, generator=generator)
        drawn = sample_inverse_cdf(probs, u).numpy()
        expected, near = reference_draws(probs, u)
        assert np.array_equal(drawn[~near], expected[~near])
        assert np.all(np.abs(drawn[near] - expected[near]) <= 1)
    # The extremes of u: u = 1 is the last token of non-zero probability, a tiny u the first one.
    last = torch.ones(64, 1, dtype=torch.float64)
    first = torch.full((64, 1), 1e-300, dtype=torch.float64)
    nonzero = [torch.nonzero(row).view(-1) for row in probs]
    assert sample_inverse_cdf(probs, last).tolist() == [int(index[-1]) for index in nonzero]
    assert sample_inverse_cdf(probs, first).tolist() == [int(index[0]) for index in nonzero]


def test_frequencies_match_the_probabilities_and_masked_tokens_never_come_out() -> None:
    vocab, draws = BLOCK * 2 + 37, 200_000
    probs = masked_probs(1, vocab, seed=0)
    drawn = sample_inverse_cdf(probs.expand(draws, vocab).contiguous(), uniforms(draws, {}, probs.device))
    counts = torch.bincount(drawn, minlength=vocab).double()
    expected = probs[0].double() * draws
    assert counts[expected == 0].sum() == 0
    kept = expected >= 5  # chi-square's usual validity bound; the rest is pooled into one cell
    observed_cells = torch.cat([counts[kept], counts[~kept].sum()[None]])
    expected_cells = torch.cat([expected[kept], expected[~kept].sum()[None]])
    chi2 = float(((observed_cells - expected_cells) ** 2 / expected_cells).sum())
    dof = int(kept.sum())
    # The mean of chi-square is dof and its standard deviation sqrt(2 dof): 6 of those is a false alarm of ~1e-6.
    # Drawing the neighbouring token instead, or ignoring the mask, gives a chi2 of ~1e5.
    assert chi2 < dof + 6 * (2 * dof) ** 0.5, f"chi2 {chi2:.0f} over {dof} degrees of freedom"


def test_a_row_with_its_own_generator_draws_the_same_again_and_others_do_not_disturb_it() -> None:
    probs = masked_probs(4, BLOCK + 5, seed=3)

    def draw() -> torch.Tensor:
        seeded = {1: torch.Generator().manual_seed(42), 3: torch.Generator().manual_seed(7)}
        return torch.stack([sample_inverse_cdf(probs, uniforms(4, seeded, probs.device)) for _ in range(30)])

    first, again = draw(), draw()
    assert torch.equal(first[:, [1, 3]], again[:, [1, 3]])
    assert not torch.equal(first[:, 1], first[:, 3])


def test_the_sampler_key_is_vllms_by_default_and_ours_on_cpu_only() -> None:
    assert engine_sampler(VllmConfig(), on_gpu=False) == "vllm"
    assert engine_sampler(VllmConfig(), on_gpu=True) == "vllm"
    assert engine_sampler(VllmConfig(sampler="inverse_cdf"), on_gpu=False) == "inverse_cdf"
    with pytest.raises(ValueError, match=r"policy\.generation\.vllm_cfg\.sampler: inverse_cdf is for CPU engines"):
        engine_sampler(VllmConfig(sampler="inverse_cdf"), on_gpu=True)
    assert VllmConfig(sampler="fast").check() == [("sampler", "must be one of inverse_cdf, vllm, got 'fast'")]
