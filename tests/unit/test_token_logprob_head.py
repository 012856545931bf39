"""`models/policy/workers/token_logprob_head.py`: token logprobs projected at selected positions only, against the full
logits path (fp64 for the kernel; fp32 through a real tiny Llama and the real losses)."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from nemo_rl_clone.algorithms.loss import ClippedPGLossFn, DPOLossFn, NLLLossFn
from nemo_rl_clone.contract.logprobs import token_logprobs_from_logits
from nemo_rl_clone.contract.loss import TokenLogprobs
from nemo_rl_clone.contract.sampling import TrainingSamplingParams
from nemo_rl_clone.distributed.model_utils import valid_counts
from nemo_rl_clone.models.policy.workers import token_logprob_head
from nemo_rl_clone.models.policy.workers.token_logprob_head import (
    Selection,
    SelectiveLMHead,
    next_token_selection,
    project_token_logprobs,
)


@pytest.mark.parametrize("chunk_size", [1, 7, 1000])
def test_projected_logprobs_and_gradients_match_log_softmax(chunk_size: int) -> None:
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(37, 16, dtype=torch.float64, generator=generator, requires_grad=True)
    weight = torch.randn(50, 16, dtype=torch.float64, generator=generator, requires_grad=True)
    targets = torch.randint(0, 50, (37,), generator=generator)
    upstream = torch.randn(37, dtype=torch.float64, generator=generator)

    expected = (hidden @ weight.t()).log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    expected_grads = torch.autograd.grad((expected * upstream).sum(), (hidden, weight))
    got = project_token_logprobs(hidden, weight, targets, chunk_size, torch.float64)
    got_grads = torch.autograd.grad((got.double() * upstream).sum(), (hidden, weight))

    assert got.dtype == torch.float32  # the logprobs are fp32 whatever the compute dtype
    torch.testing.assert_close(got.double(), expected, atol=2e-6, rtol=0)  # fp32 output
    for got_grad, expected_grad in zip(got_grads, expected_grads, strict=True):
        torch.testing.assert_close(got_grad, expected_grad, atol=1e-5, rtol=0)


def test_no_selected_position_gives_zero_gradients() -> None:
    """A microbatch with no loss token (e.g. only masked samples) selects nothing: the backward gives exact zeros."""
    hidden = torch.zeros(0, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    got = project_token_logprobs(hidden, weight, torch.zeros(0, dtype=torch.long), 4, torch.float32)
    got.sum().backward()
    assert got.shape == (0,) and weight.grad is not None and not weight.grad.any()


def test_bad_chunk_size_is_refused() -> None:
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        project_token_logprobs(torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(2), 0, torch.float32)


def tiny_llama(seed: int = 0, tied: bool = True) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
    )
    return LlamaForCausalLM(config).float()


def _batch(seed: int = 1) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    batch, width = 4, 12
    input_ids = torch.randint(0, 96, (batch, width), generator=generator)
    lengths = torch.tensor([12, 9, 5, 11])
    positions = torch.arange(width)
    token_mask = ((positions >= 3) & (positions[None, :] < lengths[:, None])).float()
    return {
        "input_ids": input_ids,
        "input_lengths": lengths,
        "token_mask": token_mask,
        "sample_mask": torch.tensor([1.0, 1.0, 0.0, 0.0]),  # DPO pairs share a mask
        "advantages": torch.randn(batch, width, generator=generator),
        "generation_logprobs": -torch.rand(batch, width, generator=generator),
        "reference_policy_logprobs": -torch.rand(batch, width, generator=generator),
    }


def _losses() -> dict[str, object]:
    return {
        "clipped_pg": ClippedPGLossFn({"force_on_policy_ratio": True, "reference_policy_kl_penalty": 0.1}),
        # the sampler's processing: filtered logprobs for the ratio, the KL term's unfiltered ones beside them
        "clipped_pg_top_k_top_p": ClippedPGLossFn(
            {"force_on_policy_ratio": True, "reference_policy_kl_penalty": 0.1},
            TrainingSamplingParams(temperature=0.7, top_k=5, top_p=0.9),
        ),
        "nll": NLLLossFn(),
        "dpo": DPOLossFn({"reference_policy_kl_penalty": 0.1}),
    }


@pytest.mark.parametrize("loss_name", ["clipped_pg", "clipped_pg_top_k_top_p", "nll", "dpo"])
def test_losses_and_gradients_equal_the_full_logits_path(loss_name: str) -> None:
    """The same loss, metrics and parameter gradients (fp32, 1e-5) from the selective head as from full logits."""
    data = _batch()
    loss_fn = _losses()[loss_name]
    assert getattr(loss_fn, "accepts_token_logprobs", False)
    seqs, toks = valid_counts(data)

    full_model = tiny_llama()
    expected, expected_metrics = loss_fn(full_model(input_ids=data["input_ids"]).logits, data, seqs, toks)
    expected.backward()

    model = tiny_llama()
    head = token_logprob_head.install(model)
    assert isinstance(head, SelectiveLMHead)
    assert [name for name, _ in model.named_parameters()] == [name for name, _ in full_model.named_parameters()]
    positions, targets = next_token_selection(data["input_ids"], data["token_mask"][:, 1:] > 0)
    sampling = getattr(loss_fn, "sampling_params", None)
    both = bool(getattr(loss_fn, "needs_unfiltered_logprobs", False))
    with head.selecting(Selection(positions, targets, 5, torch.float32, None, sampling, both)):
        logprobs = model(input_ids=data["input_ids"]).logits[:, :-1]
    given = TokenLogprobs(logprobs[..., 0], logprobs[..., 1]) if both else TokenLogprobs(logprobs)
    got, got_metrics = loss_fn(given, data, seqs, toks)
    got.backward()

    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert got_metrics.keys() == expected_metrics.keys()
    for key, value in expected_metrics.items():
        # fp32 sums: relative noise for large metrics (policy_kl_error ~50 differed by 1.1e-5 on an AMD EPYC).
        assert got_metrics[key] == pytest.approx(value, rel=1e-6, abs=1e-5), key
    for (name, param), (_, reference) in zip(model.named_parameters(), full_model.named_parameters(), strict=True):
        torch.testing.assert_close(param.grad, reference.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_selected_positions_hold_logprobs_and_the_rest_zero() -> None:
    data = _batch()
    model = tiny_llama(tied=False)
    expected = token_logprobs_from_logits(model(input_ids=data["input_ids"]).logits, data["input_ids"])
    head = token_logprob_head.install(model)
    assert head is not None
    wanted = data["token_mask"][:, 1:] > 0
    with torch.no_grad(), head.selecting(Selection(*next_token_selection(data["input_ids"], wanted), 3, torch.float32)):
        got = model(input_ids=data["input_ids"]).logits[:, :-1]
    torch.testing.assert_close(got[wanted], expected[wanted].detach(), atol=1e-5, rtol=1e-5)
    assert (got[~wanted] == 0).all()
    # Outside `selecting` the head is an ordinary linear layer again.
    assert model(input_ids=data["input_ids"]).logits.shape == (4, 12, 96)


def test_heads_the_shortcut_would_change_are_left_alone() -> None:
    model = tiny_llama()
    model.config.final_logit_softcapping = 30.0  # Gemma 2 style: logits are post-processed after the head
    assert token_logprob_head.install(model) is None
    assert type(model.lm_head) is torch.nn.Linear
