"""The KL term's gradient (enumeration over a tiny vocabulary) and the sampling-aware ClippedPG loss (filtered
ratios, unfiltered KL), split from test_loss_functions.py."""

from __future__ import annotations

import math

import pytest
import torch

from nemo_rl_clone.algorithms.loss import ClippedPGLossFn
from nemo_rl_clone.contract.logprobs import token_logprobs_from_logits
from nemo_rl_clone.contract.loss import TokenLogprobs
from nemo_rl_clone.contract.sampling import TrainingSamplingParams
from nemo_rl_clone.distributed.model_utils import valid_counts
from tests.unit.test_loss_functions import NEMO_RL_LOSS_CFG, pg_loss, random_batch, spec_layout


def _expected_kl_gradient(kl_type: str, on_policy_approximation: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(E_{x~π}[∇ of the loss's KL term for sample x], ∇ of the exact quantity it should estimate) over a 5-token
    vocabulary, both w.r.t. the logits z of π = softmax(z): the expectation is an enumeration of every token x,
    weighted by its (fixed) sampling probability π(x)."""
    generator = torch.Generator().manual_seed(4)
    z = torch.randn(5, generator=generator, dtype=torch.float64) * 1.5
    ref_lp = torch.log_softmax(torch.randn(5, generator=generator, dtype=torch.float64), dim=-1)
    pi = torch.softmax(z, dim=-1)
    loss_fn = pg_loss(
        reference_policy_kl_penalty=1.0,
        reference_policy_kl_type=kl_type,
        use_on_policy_kl_approximation=on_policy_approximation,
        kl_input_clamp_value=None,  # the estimator itself: the clamps cut a k3 of 44 at a token π rarely samples
        kl_output_clamp_value=None,
    )
    expected_grad = torch.zeros(5, dtype=torch.float64)
    for x in range(5):
        leaf = z.float().clone().requires_grad_()
        logits = torch.stack([leaf, torch.zeros(5)])[None]  # position 0 predicts token 1 = x
        lp_x = torch.log_softmax(z, dim=-1)[x].float()
        data = {
            "input_ids": torch.tensor([[0, x]]),
            "token_mask": torch.tensor([[0.0, 1.0]]),
            "sample_mask": torch.ones(1),
            "advantages": torch.zeros(1, 2),  # the policy-gradient part is 0: only the KL term has a gradient
            "prev_logprobs": torch.tensor([[0.0, lp_x]]),
            "generation_logprobs": torch.tensor([[0.0, lp_x]]),  # sampled from π itself
            "reference_policy_logprobs": torch.tensor([[0.0, float(ref_lp[x])]]),
        }
        loss, _ = loss_fn(logits, data, torch.tensor(1.0), torch.tensor(1.0))
        loss.backward()
        assert leaf.grad is not None
        expected_grad += pi[x] * leaf.grad.double()
    exact = z.clone().requires_grad_()
    lp = torch.log_softmax(exact, dim=-1)
    log_ratio = lp - ref_lp
    target = (lp.exp() * 0.5 * log_ratio**2).sum() if kl_type == "k2" else (lp.exp() * log_ratio).sum()
    target.backward()
    assert exact.grad is not None
    return expected_grad, exact.grad


@pytest.mark.parametrize("on_policy_approximation", [False, True], ids=["plain", "on_policy_approximation"])
@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3"])
def test_kl_term_gradient_is_the_exact_gradient_of_what_it_estimates(kl_type: str, on_policy_approximation: bool):
    """By enumeration over a 5-token vocabulary (1e-6, fp32 per sample): the KL term's expected gradient is
    ∇KL(π ‖ π_ref) for k1 and k3 and ∇E_π[½·(log π/π_ref)²] for k2 — which needs the score-function term; without it
    (a detached weight) k1's expected gradient is 0 and k3's is ∇KL(π_ref ‖ π)."""
    estimated, exact = _expected_kl_gradient(kl_type, on_policy_approximation)
    assert exact.abs().max() > 0.05  # a gradient worth matching
    torch.testing.assert_close(estimated, exact, atol=1e-6, rtol=0)


def test_sampling_aware_loss_takes_ratios_filtered_and_the_kl_unfiltered():
    """With the sampler's top-k/top-p, the ratio uses the filtered logprobs and the KL term the temperature-only ones
    (NeMo-RL v0.7.0): a reference equal to the policy's temperature-only logprobs gives a zero KL, which it would not
    if the KL read the filtered ones; and the logits path equals the selective head's `TokenLogprobs` path."""
    params = TrainingSamplingParams(temperature=0.7, top_k=3, top_p=0.8)
    logits, data = random_batch(seed=8, vocab=12)
    unfiltered = token_logprobs_from_logits(logits.detach(), data["input_ids"], sampling=params.unfiltered())
    filtered = token_logprobs_from_logits(logits.detach(), data["input_ids"], sampling=params)
    data["reference_policy_logprobs"] = spec_layout(unfiltered)
    assert (filtered - unfiltered).abs().max() > 0.1  # the filter matters on this batch
    loss_fn = ClippedPGLossFn({**NEMO_RL_LOSS_CFG, "reference_policy_kl_penalty": 0.5}, params)
    seqs, toks = valid_counts(data)
    loss, metrics = loss_fn(logits, data, seqs, toks)
    assert metrics["kl_penalty"] == pytest.approx(0.0, abs=1e-7)
    given = TokenLogprobs(filtered.clone().requires_grad_(), unfiltered.clone().requires_grad_())
    loss_from_head, _ = loss_fn(given, data, seqs, toks)
    assert loss_from_head.item() == pytest.approx(loss.item(), abs=1e-6)
    without_sampling, _ = ClippedPGLossFn({**NEMO_RL_LOSS_CFG, "reference_policy_kl_penalty": 0.5})(
        logits, data, seqs, toks
    )
    assert abs(without_sampling.item() - loss.item()) > 1e-3  # raw logprobs train another distribution


def test_prepare_loss_input_gives_the_loss_what_the_logits_give():
    """NeMo-RL v0.7.0's `prepare_loss_input`: the loss (value and gradient) from its output equals the loss from the
    logits, for a sampling-aware loss with a KL term (filtered and unfiltered logprobs) and for one that reads the
    logits whole (distillation's, given the logits back)."""
    from nemo_rl_clone.algorithms.loss import DistillationLossFn, prepare_loss_input

    params = TrainingSamplingParams(temperature=0.7, top_k=3, top_p=0.8)
    logits, data = random_batch(seed=9, vocab=12)
    data["reference_policy_logprobs"] = spec_layout(
        token_logprobs_from_logits(logits.detach(), data["input_ids"], sampling=params.unfiltered()) - 0.1
    )
    loss_fn = ClippedPGLossFn({**NEMO_RL_LOSS_CFG, "reference_policy_kl_penalty": 0.5}, params)
    seqs, toks = valid_counts(data)
    direct, _ = loss_fn(logits, data, seqs, toks)
    (grad_direct,) = torch.autograd.grad(direct, logits)
    loss_input, same = prepare_loss_input(logits, data, loss_fn)
    assert same is data and isinstance(loss_input["next_token_logits"], TokenLogprobs)
    assert loss_input["next_token_logits"].unfiltered is not None  # the KL term's distribution
    prepared, _ = loss_fn(loss_input.pop("next_token_logits"), data, seqs, toks, **loss_input)
    (grad_prepared,) = torch.autograd.grad(prepared, logits)
    assert prepared.item() == pytest.approx(direct.item(), abs=1e-6)
    torch.testing.assert_close(grad_prepared, grad_direct, atol=1e-6, rtol=0)
    whole, _ = prepare_loss_input(logits, data, DistillationLossFn({}))
    assert whole["next_token_logits"] is logits


def _penalty_gradient_per_token(
    z: torch.Tensor, ref_lp: torch.Tensor, kl_type: str, temperature: float, clamps: tuple[float | None, float | None]
) -> torch.Tensor:
    """[V, V]: row x = ∇_z of ClippedPGLossFn's KL term (β = 1, advantage 0) for one sampled token x."""
    vocab = z.numel()
    loss_fn = ClippedPGLossFn(
        {
            **NEMO_RL_LOSS_CFG,
            "reference_policy_kl_penalty": 1.0,
            "reference_policy_kl_type": kl_type,
            "kl_input_clamp_value": clamps[0],
            "kl_output_clamp_value": clamps[1],
        },
        TrainingSamplingParams(temperature=temperature),
    )
    lp = torch.log_softmax(z / temperature, dim=-1)
    rows = []
    for x in range(vocab):
        leaf = z.float().clone().requires_grad_()
        data = {
            "input_ids": torch.tensor([[0, x]]),
            "token_mask": torch.tensor([[0.0, 1.0]]),
            "sample_mask": torch.ones(1),
            "advantages": torch.zeros(1, 2),
            "prev_logprobs": torch.tensor([[0.0, float(lp[x])]]),
            "generation_logprobs": torch.tensor([[0.0, float(lp[x])]]),
            "reference_policy_logprobs": torch.tensor([[0.0, float(ref_lp[x])]]),
        }
        loss, _ = loss_fn(torch.stack([leaf, torch.zeros(vocab)])[None], data, torch.tensor(1.0), torch.tensor(1.0))
        (grad,) = torch.autograd.grad(loss, leaf)
        rows.append(grad.double())
    return torch.stack(rows)


def _nemo_rl_rule(
    z: torch.Tensor, ref_lp: torch.Tensor, kl_type: str, temperature: float, clamps: tuple[float | None, float | None]
) -> tuple[torch.Tensor, torch.Tensor]:
    """By hand, NeMo-RL v0.7.0's rule: ([V, V] per-token gradients, [V] bool clamped). For sampled x with
    d = lp_ref(x) − lp(x): 0 where |d| > input clamp or |k(d)| > output clamp, else (∂k/∂lp + k)·∇_z lp(x), with
    ∂k/∂lp = 1 (k1), −d (k2), 1 − e^d (k3) and ∇_z lp(x) = (onehot(x) − π_T) / T."""
    pi = torch.softmax(z / temperature, dim=-1)
    d = ref_lp - torch.log(pi)
    k = {"k1": -d, "k2": d.square() / 2, "k3": d.exp() - d - 1}[kl_type]
    dk_dlp = {"k1": torch.ones_like(d), "k2": -d, "k3": 1 - d.exp()}[kl_type]
    clamped = torch.zeros_like(d, dtype=torch.bool)
    if clamps[0] is not None:
        clamped |= d.abs() > clamps[0]
    if clamps[1] is not None:
        clamped |= k.abs() > clamps[1]
    grad_lp = (torch.eye(z.numel(), dtype=z.dtype) - pi) / temperature
    per_token = torch.where(clamped, 0.0, dk_dlp + k)[:, None] * grad_lp
    return per_token, clamped


CLAMP_CASES = {"no_clamp": (None, None), "input_clamp": (1.0, None), "output_clamp": (None, 0.5), "both": (1.0, 0.5)}


@pytest.mark.parametrize("temperature", [1.0, 0.7], ids=["T1", "T0.7"])
@pytest.mark.parametrize("clamp_case", list(CLAMP_CASES))
@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3"])
def test_kl_penalty_gradient_follows_nemo_rl_rule_where_clamps_bind(kl_type: str, clamp_case: str, temperature: float):
    """By enumeration over a 6-token vocabulary (1e-6 absolute, and relative for the per-token gradients of up to
    ~6 from the fp32 loss): each sampled token's gradient of the KL term, and their
    expectation under π_T, equal NeMo-RL v0.7.0's rule by hand — a token where a clamp binds gets none (before the
    fix, w·clamp(k) left clamp·∇lp there); unclamped, the expectation is ∇ of the KL the estimator names."""
    clamps = CLAMP_CASES[clamp_case]
    generator = torch.Generator().manual_seed(11)
    z = torch.randn(6, generator=generator, dtype=torch.float64) * 1.5
    ref_lp = torch.log_softmax(torch.randn(6, generator=generator, dtype=torch.float64) * 1.5, dim=-1)
    measured = _penalty_gradient_per_token(z, ref_lp, kl_type, temperature, clamps)
    by_hand, clamped = _nemo_rl_rule(z, ref_lp, kl_type, temperature, clamps)
    if clamp_case != "no_clamp":  # the clamp binds on some sampled tokens and not on others
        assert 0 < int(clamped.sum()) < z.numel(), clamped
    torch.testing.assert_close(measured, by_hand, atol=1e-6, rtol=1e-6)  # the loss runs in fp32
    pi = torch.softmax(z / temperature, dim=-1)
    expected = (pi[:, None] * measured).sum(dim=0)
    torch.testing.assert_close(expected, (pi[:, None] * by_hand).sum(dim=0), atol=1e-6, rtol=0)
    if clamp_case == "no_clamp":
        exact = z.clone().requires_grad_()
        lp = torch.log_softmax(exact / temperature, dim=-1)
        log_ratio = lp - ref_lp
        target = (lp.exp() * 0.5 * log_ratio**2).sum() if kl_type == "k2" else (lp.exp() * log_ratio).sum()
        (exact_grad,) = torch.autograd.grad(target, exact)
        assert exact_grad.abs().max() > 0.05
        torch.testing.assert_close(expected, exact_grad, atol=1e-6, rtol=0)


def test_kl_penalty_leaves_a_token_clamped_by_the_default_clamp_alone():
    """π = softmax(3, 1, 0, −2), π_ref = softmax(1, 1, 0, 1), k3, β = 1, sampled token 3: d = 3.96 and k3 = 47.6 is
    cut to 10 by the default output clamp. Its gradient on the logits is 0 (NeMo-RL v0.7.0); weighting after the
    clamp gave 10·∇lp, about 9.9 on z₃ — pushing a token the policy already suppresses further down."""
    z = torch.tensor([3.0, 1.0, 0.0, -2.0], dtype=torch.float64)
    ref_lp = torch.log_softmax(torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=torch.float64), dim=-1)
    d = float(ref_lp[3] - torch.log_softmax(z, dim=-1)[3])
    assert d == pytest.approx(3.96, abs=0.01) and math.exp(d) - d - 1 == pytest.approx(47.6, abs=0.1)
    measured = _penalty_gradient_per_token(z, ref_lp, "k3", 1.0, (20.0, 10.0))
    assert measured[3].abs().max().item() == 0.0
