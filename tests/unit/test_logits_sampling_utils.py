"""The trainer's copy of the sampler's processing (`algorithms/logits_sampling_utils.py`): the kept set against vLLM's
own sampler function, logprobs and gradients against a hand enumeration over a 6-token vocabulary, and the three
places that compute them (plain logits, chunked logits, the selective LM head)."""

from __future__ import annotations

import math

import pytest
import torch

from nemo_rl_clone.algorithms.logits_sampling_utils import TrainingSamplingParams, keep_threshold, processed_logits
from nemo_rl_clone.distributed.model_utils import token_logprobs_from_logits
from nemo_rl_clone.models.policy.workers.token_logprob_head import project_token_logprobs

SETTINGS = [
    TrainingSamplingParams(0.7, None, 1.0),
    TrainingSamplingParams(1.0, 3, 1.0),
    TrainingSamplingParams(1.0, None, 0.6),
    TrainingSamplingParams(0.7, 4, 0.9),
    TrainingSamplingParams(2.0, 2, 0.5),
    TrainingSamplingParams(0.5, None, 0.3),
]


def vllm_kept(scaled: torch.Tensor, params: TrainingSamplingParams) -> torch.Tensor:
    """The tokens vLLM's CPU sampler keeps (its own function, as its sampler calls it on CPU)."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    rows = scaled.shape[0]
    k = None if params.top_k is None else torch.full((rows,), params.top_k, dtype=torch.long)
    p = None if params.top_p >= 1.0 else torch.full((rows,), params.top_p)
    return apply_top_k_top_p_pytorch(scaled.clone(), k, p, allow_cpu_sync=True).isfinite()


@pytest.mark.parametrize("params", SETTINGS, ids=str)
def test_kept_set_is_vllms(params: TrainingSamplingParams) -> None:
    """Same kept tokens as vLLM's sampler on 64 rows of a 300-token vocabulary (continuous logits), and with ties at
    the top-k boundary (logits on a 0.5 grid: vLLM keeps every tie, so do we)."""
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(64, 300, generator=generator) * 3
    for values in (logits, (logits * 2).round() / 2):
        scaled = values / params.temperature
        if values is not logits and params.top_p < 1.0:
            continue  # ties inside the nucleus: vLLM's order among equal values is its sort's, not a rule
        ours = scaled >= keep_threshold(scaled, params).unsqueeze(-1)
        assert torch.equal(ours, vllm_kept(scaled, params))


def enumerated_logprobs(logits: list[float], params: TrainingSamplingParams, target: int) -> tuple[float, list[float]]:
    """(log p(target), d log p(target) / d logits) under the processed distribution, by hand: sort, keep the top k,
    walk down adding probabilities while the mass above stays below p, renormalise; the target always counts."""
    scaled = [z / params.temperature for z in logits]
    order = sorted(range(len(scaled)), key=lambda i: -scaled[i])
    kept = order[: params.top_k] if params.top_k is not None else order
    total = sum(math.exp(scaled[i]) for i in kept)
    nucleus, mass = [], 0.0
    for i in kept:
        if params.top_p < 1.0 and mass >= params.top_p:
            break
        nucleus.append(i)
        mass += math.exp(scaled[i]) / total
    if target not in nucleus:
        nucleus.append(target)
    norm = math.log(sum(math.exp(scaled[i]) for i in nucleus))
    grad = [
        ((i == target) - (math.exp(scaled[i] - norm) if i in nucleus else 0.0)) / params.temperature
        for i in range(len(scaled))
    ]
    return scaled[target] - norm, grad


@pytest.mark.parametrize("params", SETTINGS, ids=str)
@pytest.mark.parametrize("where", ["logits", "chunked", "selective_head"])
def test_logprobs_and_gradients_by_enumeration(params: TrainingSamplingParams, where: str) -> None:
    """A 6-token vocabulary, every target (kept or not): logprob and logit gradient equal the hand enumeration to
    1e-6 (fp32), whichever of the three computations produces them."""
    generator = torch.Generator().manual_seed(11)
    rows = torch.randn(6, 6, generator=generator) * 2  # row r scores target r: every token once
    targets = torch.arange(6)
    expected = [enumerated_logprobs(rows[r].tolist(), params, r) for r in range(6)]
    if where == "selective_head":
        # hidden = identity, weight = logitsᵀ: the head's logits are exactly `rows`
        hidden = torch.eye(6, requires_grad=True)
        weight = rows.t().contiguous().requires_grad_()
        lp = project_token_logprobs(hidden, weight, targets, 4, torch.float32, sampling=params)
        lp.sum().backward()
        assert weight.grad is not None
        grad = weight.grad.t()
    else:
        leaf = rows.clone().requires_grad_()
        # One sequence per row: position 0 predicts token 1 = the target; position 1 is not read.
        logits = torch.stack([leaf, torch.zeros_like(leaf)], dim=1)
        input_ids = torch.stack([torch.zeros_like(targets), targets], dim=1)
        chunk = 1 if where == "chunked" else None
        lp = token_logprobs_from_logits(logits, input_ids, chunk_size=chunk, sampling=params)[:, 0]
        lp.sum().backward()
        assert leaf.grad is not None
        grad = leaf.grad
    for r in range(6):
        assert lp[r].item() == pytest.approx(expected[r][0], abs=1e-6), (r, lp[r], expected[r][0])
        assert grad[r].tolist() == pytest.approx(expected[r][1], abs=1e-6), r


def test_identity_and_greedy_change_nothing() -> None:
    logits = torch.randn(3, 5, 7)
    assert torch.equal(processed_logits(logits, torch.zeros(3, 5, dtype=torch.long), TrainingSamplingParams()), logits)

    class Greedy:
        temperature, top_k, top_p = 0.0, 5, 0.5

    assert TrainingSamplingParams.from_generation(Greedy()).is_identity  # vLLM reports greedy logprobs unprocessed
    assert TrainingSamplingParams.from_generation(None).is_identity


def test_selective_head_gives_the_kl_terms_unfiltered_logprobs_from_the_same_projection() -> None:
    """``also_unfiltered``: column 0 under top-k/top-p, column 1 under the temperature alone (the KL term's), and
    the gradient of any mix of the two is the same mix of their enumerated gradients (1e-6, fp32)."""
    params = TrainingSamplingParams(0.7, 3, 0.8)
    generator = torch.Generator().manual_seed(12)
    rows = torch.randn(6, 6, generator=generator) * 2
    targets = torch.arange(6)
    hidden, weight = torch.eye(6), rows.t().contiguous().requires_grad_()
    both = project_token_logprobs(hidden, weight, targets, 4, torch.float32, sampling=params, also_unfiltered=True)
    (both[:, 0] * 2.0 + both[:, 1] * -3.0).sum().backward()
    assert weight.grad is not None
    for r in range(6):
        filtered, grad_filtered = enumerated_logprobs(rows[r].tolist(), params, r)
        unfiltered, grad_unfiltered = enumerated_logprobs(rows[r].tolist(), params.unfiltered(), r)
        assert both[r].tolist() == pytest.approx([filtered, unfiltered], abs=1e-6)
        mixed = [2.0 * a - 3.0 * b for a, b in zip(grad_filtered, grad_unfiltered, strict=True)]
        assert weight.grad.t()[r].tolist() == pytest.approx(mixed, abs=1e-6), r
