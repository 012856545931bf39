"""PPO's math against independent computations: GAE (by hand, and a brute-force sum over future TD errors) and the
clipped value loss (by hand). All in float64; the tolerance is 1e-10, far below any off-by-one or leak (those move
results by ~0.1) and far above float64 rounding of sums of ≤ 12 terms."""

from __future__ import annotations

import math

import pytest
import torch

from nemo_rl_clone.algorithms.ppo import (
    GAEConfig,
    MseValueLossFn,
    clipped_value_loss,
    compute_advantages_and_returns,
    explained_variance,
    generalized_advantages,
    last_token_rewards,
    length_adaptive_lambda,
    whiten,
)

TOL = {"atol": 1e-10, "rtol": 0.0}
f64 = torch.float64


def close(actual: torch.Tensor, expected: torch.Tensor | list) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=f64), **TOL)


def brute_force_gae(rewards, values, mask, gamma, lam):
    """A_k = Σ_{j≥k} (γλ)^{j−k} δ_j over each row's response tokens taken in order (masked positions skipped),
    δ_j = r_j + γ·V_{j+1} − V_j with V = 0 after the last one; written as explicit sums, no recursion."""
    advantages = torch.zeros_like(values)
    for b in range(values.shape[0]):
        idx = [t for t in range(values.shape[1]) if mask[b, t] != 0]
        lam_b = float(lam[b]) if isinstance(lam, torch.Tensor) else lam
        r = [float(rewards[b, t]) for t in idx]
        v = [float(values[b, t]) for t in idx] + [0.0]
        deltas = [r[j] + gamma * v[j + 1] - v[j] for j in range(len(idx))]
        for k, t in enumerate(idx):
            advantages[b, t] = sum((gamma * lam_b) ** (j - k) * deltas[j] for j in range(k, len(idx)))
    return advantages, torch.where(mask != 0, advantages + values, 0.0)


def random_batch(seed: int = 0):
    """Rows with responses of different lengths and places: full, late start, early end, a gap (an environment
    turn between two response segments), a single token, none. Padding holds garbage."""
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 12
    mask = torch.zeros(B, T, dtype=torch.long)
    mask[0, :] = 1
    mask[1, 4:] = 1
    mask[2, 2:7] = 1
    mask[3, 1:4] = 1
    mask[3, 7:10] = 1  # gap at 4..6
    mask[4, 5] = 1
    # row 5: no response token
    values = torch.randn(B, T, generator=g, dtype=f64)
    token_rewards = torch.where(mask != 0, torch.randn(B, T, generator=g, dtype=f64), 0.0)
    return token_rewards, values, mask


# --------------------------------------------------------------------------------------------------- GAE


def test_three_token_example_by_hand():
    # prompt token, 3 response tokens, padding; reward 1 on the last response token; γ = 0.9, λ = 0.8 (γλ = 0.72).
    #   δ2 = 1 + 0.9·0 − 0.6 = 0.4           A2 = 0.4
    #   δ1 = 0 + 0.9·0.6 − 0.4 = 0.14        A1 = 0.14 + 0.72·0.4 = 0.428
    #   δ0 = 0 + 0.9·0.4 − 0.5 = −0.14       A0 = −0.14 + 0.72·0.428 = 0.16816
    values = torch.tensor([[9.0, 0.5, 0.4, 0.6, 7.0]], dtype=f64)
    mask = torch.tensor([[0, 1, 1, 1, 0]])
    advantages, returns = generalized_advantages(torch.tensor([1.0], dtype=f64), values, mask, 0.9, 0.8)
    close(advantages, [[0.0, 0.16816, 0.428, 0.4, 0.0]])
    close(returns, [[0.0, 0.66816, 0.828, 1.0, 0.0]])


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 0.95), (0.9, 0.8), (0.99, 1.0), (0.7, 0.0), (1.0, 1.0)])
def test_matches_brute_force_sum_with_per_token_rewards(gamma, lam):
    rewards, values, mask = random_batch()
    advantages, returns = generalized_advantages(rewards, values, mask, gamma, lam)
    expected_advantages, expected_returns = brute_force_gae(rewards, values, mask, gamma, lam)
    close(advantages, expected_advantages)
    close(returns, expected_returns)


def test_matches_brute_force_sum_with_a_reward_per_sequence():
    _, values, mask = random_batch(1)
    scalar = torch.tensor([1.0, -1.0, 0.5, 2.0, 0.25, 3.0], dtype=f64)
    placed = last_token_rewards(scalar, mask)
    # On the last response token only; the row without response gets nothing.
    assert placed[0, 11] == 1.0 and placed[1, 11] == -1.0 and placed[2, 6] == 0.5 and placed[3, 9] == 2.0
    assert placed[4, 5] == 0.25 and placed[5].abs().sum() == 0 and (placed != 0).sum() == 5
    advantages, returns = generalized_advantages(scalar, values, mask, 0.95, 0.9)
    expected_advantages, expected_returns = brute_force_gae(placed, values, mask, 0.95, 0.9)
    close(advantages, expected_advantages)
    close(returns, expected_returns)


def test_lambda_one_gamma_one_is_monte_carlo():
    rewards, values, mask = random_batch(2)
    advantages, returns = generalized_advantages(rewards, values, mask, 1.0, 1.0)
    # returns = the sum of the rewards at this and every later response token of the row
    future = rewards.flip(-1).cumsum(-1).flip(-1)
    close(returns, torch.where(mask != 0, future, 0.0))
    close(advantages, torch.where(mask != 0, future - values, 0.0))


def test_lambda_zero_is_one_step_td():
    rewards, values, mask = random_batch(3)
    gamma = 0.9
    advantages, _ = generalized_advantages(rewards, values, mask, gamma, 0.0)
    expected = torch.zeros_like(values)
    for b in range(values.shape[0]):
        idx = mask[b].nonzero().squeeze(-1).tolist()
        for k, t in enumerate(idx):
            next_value = values[b, idx[k + 1]] if k + 1 < len(idx) else 0.0
            expected[b, t] = rewards[b, t] + gamma * next_value - values[b, t]
    close(advantages, expected)


def test_nothing_outside_the_mask_reaches_the_result():
    rewards, values, mask = random_batch(4)
    advantages, returns = generalized_advantages(rewards, values, mask, 0.95, 0.9)
    outside = mask == 0
    noisy_values = torch.where(outside, torch.full_like(values, float("nan")), values)
    noisy_values[1, 0] = float("inf")
    noisy_rewards = torch.where(outside, torch.full_like(rewards, 1e6), rewards)
    noisy_advantages, noisy_returns = generalized_advantages(noisy_rewards, noisy_values, mask, 0.95, 0.9)
    close(noisy_advantages, advantages)
    close(noisy_returns, returns)
    assert (advantages[outside] == 0).all() and (returns[outside] == 0).all()


def test_the_last_response_token_bootstraps_from_zero():
    # A row padded with a large value after its response must equal the same row cut at the response's end.
    values = torch.tensor([[0.3, 0.2, 0.1, 5.0, 5.0]], dtype=f64)
    padded, _ = generalized_advantages(torch.tensor([1.0], dtype=f64), values, torch.tensor([[1, 1, 1, 0, 0]]), 1, 0.9)
    cut, _ = generalized_advantages(torch.tensor([1.0], dtype=f64), values[:, :3], torch.ones(1, 3), 1, 0.9)
    close(padded[:, :3], cut)
    close(cut[0, 2], 1.0 - 0.1)


def test_float32_inputs_give_float32_and_gradients_do_not_flow():
    rewards, values, mask = random_batch(5)
    values32 = values.float().requires_grad_()
    advantages, returns = generalized_advantages(rewards.float(), values32, mask, 1.0, 0.95)
    assert advantages.dtype == returns.dtype == torch.float32 and not returns.requires_grad
    expected, _ = generalized_advantages(rewards, values, mask, 1.0, 0.95)
    torch.testing.assert_close(advantages.double(), expected, atol=1e-5, rtol=0)


def test_bad_inputs_are_refused():
    values, mask = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="both be"):
        generalized_advantages(torch.zeros(2), values, mask[:, :2], 1.0, 1.0)
    with pytest.raises(ValueError, match="lam must be in"):
        generalized_advantages(torch.zeros(2), values, mask, 1.0, 1.5)
    with pytest.raises(ValueError, match="gamma must be in"):
        generalized_advantages(torch.zeros(2), values, mask, -0.1, 1.0)
    with pytest.raises(ValueError, match="rewards must be"):
        generalized_advantages(torch.zeros(3), values, mask, 1.0, 1.0)


# ------------------------------------------------------------------------------------ whitening and VAPO


def test_whiten_gives_mean_zero_unbiased_std_one_over_response_tokens():
    rewards, values, mask = random_batch(6)
    advantages, _ = generalized_advantages(rewards, values, mask, 1.0, 0.95)
    white = whiten(advantages, mask)
    valid = white[mask != 0]
    assert abs(valid.mean().item()) < 1e-12
    # unbiased std (n − 1), as NeMo-RL; ε = 1e-8 shifts it by ~1e-8 relative
    assert abs(valid.std(unbiased=True).item() - 1.0) < 1e-7
    assert abs(valid.std(unbiased=False).item() - 1.0) > 1e-3  # the other std would fail the line above
    assert (white[mask == 0] == 0).all()
    one_token = whiten(torch.tensor([[3.0, 4.0]], dtype=f64), torch.tensor([[0, 1]]))
    close(one_token, [[0.0, 0.0]])  # no spread to measure: 0, not NaN


def test_decoupled_lambdas_and_normalisation_from_the_config():
    rewards, values, mask = random_batch(7)
    cfg = GAEConfig(gae_lambda=0.5, gae_gamma=0.99, gae_lambda_value=1.0, gae_lambda_policy=0.9)
    advantages, returns = compute_advantages_and_returns(cfg, rewards, values, mask)
    close(returns, brute_force_gae(rewards, values, mask, 0.99, 1.0)[1])
    close(advantages, whiten(brute_force_gae(rewards, values, mask, 0.99, 0.9)[0], mask))
    plain = GAEConfig(gae_lambda=0.8, gae_gamma=0.9, normalize_advantages=False)
    advantages, returns = compute_advantages_and_returns(plain, rewards, values, mask)
    expected_advantages, expected_returns = brute_force_gae(rewards, values, mask, 0.9, 0.8)
    close(advantages, expected_advantages)
    close(returns, expected_returns)


def test_length_adaptive_lambda_per_sample():
    mask = torch.zeros(3, 40, dtype=torch.long)
    mask[0, :] = 1  # l = 40: λ = 1 − 1/(0.05·40) = 0.5
    mask[1, :30] = 1  # l = 30: λ = 1 − 1/1.5 = 1/3
    mask[2, :10] = 1  # l = 10: α·l = 0.5 ≤ 1, so λ = 0
    close(length_adaptive_lambda(mask, 0.05), [0.5, 1.0 / 3.0, 0.0])
    g = torch.Generator().manual_seed(8)
    values = torch.randn(3, 40, generator=g, dtype=f64)
    rewards = torch.tensor([1.0, 0.0, 1.0], dtype=f64)
    cfg = GAEConfig(gae_gamma=1.0, gae_lambda_value=1.0, length_adaptive_alpha=0.05, normalize_advantages=False)
    advantages, returns = compute_advantages_and_returns(cfg, rewards, values, mask)
    placed = last_token_rewards(rewards, mask)
    close(advantages, brute_force_gae(placed, values, mask, 1.0, torch.tensor([0.5, 1.0 / 3.0, 0.0], dtype=f64))[0])
    close(returns, brute_force_gae(placed, values, mask, 1.0, 1.0)[1])


# ----------------------------------------------------------------------------------------- value loss

# Two response tokens and one masked one, cliprange c = 0.2, scale 0.4:
#   token a: V_old 0.0, V 0.5, R 1.0 → clip(V) = 0.2; (V − R)² = 0.25 < (0.2 − 1)² = 0.64: clipped, ℓ = 0.64
#   token b: V_old 0.5, V 0.6, R 0.0 → clip(V) = 0.6 (inside [0.3, 0.7]); ℓ = 0.36, not clipped
#   L = 0.4 · ½ · (0.64 + 0.36)/2 = 0.1;  clip fraction 1/2
# Clipping around R instead (clamp(V, R − c, R + c)) would give ℓ = 0.25 and 0.36, L = 0.061.
V = torch.tensor([[0.5, 0.6, float("nan")]], dtype=f64)
V_OLD = torch.tensor([[0.0, 0.5, 3.0]], dtype=f64)
R = torch.tensor([[1.0, 0.0, float("inf")]], dtype=f64)
M = torch.tensor([[1.0, 1.0, 0.0]], dtype=f64)


def test_value_loss_by_hand_with_a_clipped_and_an_unclipped_token():
    values = V.clone().requires_grad_()
    loss, metrics = clipped_value_loss(values, V_OLD, R, M, scale=0.4, cliprange=0.2)
    assert loss.item() == pytest.approx(0.1, abs=1e-7)  # computed in float32
    assert metrics["vf_clipfrac"] == pytest.approx(0.5)
    assert metrics["values_mean"] == pytest.approx(0.55) and metrics["returns_mean"] == pytest.approx(0.5)
    loss.backward()
    assert values.grad is not None
    # token a: V is beyond the clip and the clipped term wins, so no gradient; token b: 0.4 · ½ · ½ · 2·(0.6 − 0)
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, 0.12, 0.0]], dtype=f64))


def test_value_loss_without_clipping():
    for cliprange in (None, 0.0):
        loss, metrics = clipped_value_loss(V, V_OLD, R, M, scale=0.4, cliprange=cliprange)
        assert loss.item() == pytest.approx(0.4 * 0.5 * (0.25 + 0.36) / 2, abs=1e-7)
        assert metrics["vf_clipfrac"] == 0.0
    loss, _ = clipped_value_loss(V, V_OLD, R, M)  # NeMo-RL's defaults: scale 1, no clip
    assert loss.item() == pytest.approx(0.5 * (0.25 + 0.36) / 2, abs=1e-7)


def test_explained_variance_and_microbatch_shares_add_up():
    g = torch.Generator().manual_seed(9)
    returns = torch.randn(4, 6, generator=g, dtype=f64)
    values = returns + 0.3 * torch.randn(4, 6, generator=g, dtype=f64)
    old = values + 0.1 * torch.randn(4, 6, generator=g, dtype=f64)
    mask = (torch.rand(4, 6, generator=g) > 0.3).double()
    whole_loss, whole = clipped_value_loss(values, old, returns, mask, scale=0.4, cliprange=0.05)
    r, v = returns[mask != 0], values[mask != 0]
    expected_ev = 1 - (r - v).var().item() / r.var().item()
    assert explained_variance(whole) == pytest.approx(expected_ev, abs=1e-6)
    total = mask.sum()
    parts = [
        clipped_value_loss(values[i : i + 2], old[i : i + 2], returns[i : i + 2], mask[i : i + 2], 0.4, 0.05, total)
        for i in (0, 2)
    ]
    assert sum(loss.item() for loss, _ in parts) == pytest.approx(whole_loss.item(), abs=1e-6)
    summed = {key: sum(metrics[key] for _, metrics in parts) for key in whole}
    assert summed["vf_clipfrac"] == pytest.approx(whole["vf_clipfrac"], abs=1e-6)
    assert explained_variance(summed) == pytest.approx(expected_ev, abs=1e-5)
    perfect = clipped_value_loss(returns, returns, returns, mask)[1]
    assert explained_variance(perfect) == pytest.approx(1.0, abs=1e-6)
    flat = clipped_value_loss(values, values, torch.ones_like(returns), mask)[1]
    assert math.isnan(explained_variance(flat))  # returns that do not vary: undefined


def test_value_loss_fn_reads_the_batch_like_nemo_rl():
    loss_fn = MseValueLossFn({"scale": 0.4, "cliprange": 0.2})
    data = {
        "values": torch.cat([V_OLD, V_OLD]),
        "returns": torch.cat([R, R]),
        "token_mask": torch.cat([M, M]),
        "sample_mask": torch.tensor([1.0, 0.0]),  # the second row trains nothing
    }
    head_output = torch.cat([V, torch.full_like(V, 100.0)]).unsqueeze(-1)  # [B, T, 1]
    loss, metrics = loss_fn(head_output, data, torch.tensor(1.0), torch.tensor(2.0))
    assert loss.item() == pytest.approx(0.1, abs=1e-7)
    assert metrics["num_valid_samples"] == 1 and metrics["vf_clipfrac"] == pytest.approx(0.5)
    with pytest.raises(KeyError, match="returns"):
        loss_fn(head_output, {k: v for k, v in data.items() if k != "returns"}, torch.tensor(1.0), torch.tensor(2.0))
