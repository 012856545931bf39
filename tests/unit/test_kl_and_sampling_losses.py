"""The KL term's gradient (enumeration over a tiny vocabulary) and the sampling-aware ClippedPG loss (filtered
ratios, unfiltered KL), split from test_loss_functions.py."""

from __future__ import annotations

import pytest
import torch

from nemo_rl_clone.algorithms.logits_sampling_utils import TrainingSamplingParams
from nemo_rl_clone.algorithms.loss import ClippedPGLossFn
from nemo_rl_clone.algorithms.loss.interfaces import TokenLogprobs
from nemo_rl_clone.distributed.model_utils import token_logprobs_from_logits, valid_counts
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
    params = TrainingSamplingParams(0.7, 3, 0.8)
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

    params = TrainingSamplingParams(0.7, 3, 0.8)
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
