"""masked_mean and the k3 KL estimator against hand-computed values."""

import math

import pytest
import torch

from nemo_rl_clone.algorithms.utils import calculate_kl, masked_mean


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, clamp: float | None = 20.0) -> torch.Tensor:
    """k3 with only the input clamp (``calculate_kl``'s output clamp off)."""
    return calculate_kl(logprobs, ref_logprobs, "k3", clamp, None)


VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])


def test_masked_mean_all_dims():
    assert masked_mean(VALUES, MASK).item() == pytest.approx(2.0)  # (1 + 3) / 2
    assert masked_mean(VALUES, torch.ones_like(VALUES)).item() == pytest.approx(3.5)


def test_masked_mean_along_dim_gives_zero_for_an_empty_row():
    torch.testing.assert_close(masked_mean(VALUES, MASK, dim=-1), torch.tensor([2.0, 0.0]))
    torch.testing.assert_close(masked_mean(VALUES, MASK, dim=0), torch.tensor([1.0, 0.0, 3.0]))


def test_masked_mean_empty_mask_is_zero_not_nan_with_finite_gradient():
    values = VALUES.clone().requires_grad_()
    result = masked_mean(values, torch.zeros_like(values))
    assert result.item() == 0.0
    result.backward()
    assert torch.equal(values.grad, torch.zeros_like(values))


def test_masked_mean_ignores_nan_and_inf_at_masked_positions():
    values = torch.tensor([[1.0, float("nan"), 3.0], [float("inf"), float("-inf"), 0.0]], requires_grad=True)
    result = masked_mean(values, MASK)
    assert result.item() == pytest.approx(2.0)
    result.backward()
    torch.testing.assert_close(values.grad, MASK / 2)


def test_masked_mean_global_normalization_factor():
    assert masked_mean(VALUES, MASK, global_normalization_factor=8).item() == pytest.approx(0.5)
    factor = torch.tensor(4.0)
    torch.testing.assert_close(
        masked_mean(VALUES, MASK, dim=-1, global_normalization_factor=factor), torch.tensor([1.0, 0.0])
    )
    assert masked_mean(VALUES, MASK, global_normalization_factor=torch.tensor(0)).item() == 0.0


def test_masked_mean_broadcasts_a_per_row_mask():
    sample_mask = torch.tensor([[0.0], [1.0]])
    assert masked_mean(VALUES, sample_mask).item() == pytest.approx(5.0)


@pytest.mark.parametrize(
    ("logprob", "ref_logprob", "expected"),
    [
        (-1.0, -1.0, 0.0),
        (-1.0, -2.0, math.exp(-1.0)),  # d = -1: e^-1 + 1 - 1
        (-2.0, -1.0, math.e - 2.0),  # d = 1
        (-3.0, -0.5, math.exp(2.5) - 3.5),
    ],
)
def test_kl_k3_hand_values(logprob, ref_logprob, expected):
    result = kl_k3(torch.tensor([logprob], dtype=torch.float64), torch.tensor([ref_logprob], dtype=torch.float64))
    assert result.item() == pytest.approx(expected, abs=1e-12)


def test_kl_k3_clamps_the_log_ratio_and_its_gradient():
    logprobs = torch.tensor([-40.0, -1.0], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-10.0, -1.5], dtype=torch.float64)
    result = kl_k3(logprobs, ref)
    assert result[0].item() == pytest.approx(math.exp(20.0) - 21.0)  # d = 30 clamped to 20
    result.sum().backward()
    assert logprobs.grad[0].item() == 0.0
    assert logprobs.grad[1].item() == pytest.approx(1.0 - math.exp(-0.5))  # d/dlp (e^d - d - 1), d = ref - lp
    unclamped = kl_k3(logprobs.detach(), ref, clamp=None)
    assert unclamped[0].item() == pytest.approx(math.exp(30.0) - 31.0)


def test_kl_k3_expectation_under_policy_is_exact_kl():
    """Σ_i p_i k3(log p_i, log q_i) = KL(p ‖ q): the estimator is unbiased for tokens drawn from p."""
    generator = torch.Generator().manual_seed(0)
    log_p = torch.randn(7, generator=generator, dtype=torch.float64).log_softmax(-1)
    log_q = torch.randn(7, generator=generator, dtype=torch.float64).log_softmax(-1)
    expectation = (log_p.exp() * kl_k3(log_p, log_q)).sum()
    kl = (log_p.exp() * (log_p - log_q)).sum()
    assert expectation.item() == pytest.approx(kl.item(), abs=1e-12)
    assert (kl_k3(log_p, log_q) >= 0).all()
