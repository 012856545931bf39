"""`models/policy/dtensor/bf16_backward.py` and `worker_setup.backward_dtype`: fp32 forward, bf16 gradient matmuls."""

import pytest
import torch
from transformers import LlamaForCausalLM

from nemo_rl_clone.models.policy.dtensor import bf16_backward
from nemo_rl_clone.models.policy.dtensor.bf16_backward import Bf16BackwardLinear
from nemo_rl_clone.models.policy.workers import token_logprob_head
from nemo_rl_clone.models.policy.workers.worker_setup import backward_dtype
from nemo_rl_clone.utils.platform import cpu_has_native_bf16
from tests.unit.test_token_logprob_head import tiny_llama


def _nll(model: LlamaForCausalLM, input_ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=input_ids).logits[:, :-1]
    return -logits.log_softmax(-1).gather(-1, input_ids[:, 1:, None]).mean()


def test_forward_is_exact_fp32_and_gradients_are_close() -> None:
    input_ids = torch.randint(0, 96, (3, 10), generator=torch.Generator().manual_seed(1))
    reference = tiny_llama()
    expected = _nll(reference, input_ids)
    expected.backward()

    model = tiny_llama()
    assert bf16_backward.install(model, skip=model.lm_head) == 2 * 7  # q, k, v, o, gate, up, down per layer
    assert type(model.lm_head) is torch.nn.Linear
    assert isinstance(model.model.layers[0].mlp.down_proj, Bf16BackwardLinear)
    got = _nll(model, input_ids)
    got.backward()

    assert torch.equal(got, expected)  # the forward (and so every logprob) is untouched
    for (name, param), (_, ref) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
        assert param.grad.dtype == torch.float32
        # bf16 has an 8-bit mantissa: gradients agree to ~1% of their scale, never exactly (the cast really happens).
        scale = ref.grad.abs().max().clamp(min=1e-12)
        assert (param.grad - ref.grad).abs().max() / scale < 0.05, name
    layer_grad = model.model.layers[0].mlp.down_proj.weight.grad
    assert not torch.equal(layer_grad, reference.model.layers[0].mlp.down_proj.weight.grad)


def test_no_grad_forward_uses_the_plain_linear() -> None:
    """Inference (logprobs, generation checks) skips the custom Function; training goes through it."""
    model = tiny_llama()
    bf16_backward.install(model)
    layer = model.model.layers[0].mlp.down_proj
    x = torch.randn(2, layer.in_features)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[1, 2, 3]])).logits
        assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight))
    assert out.dtype == torch.float32 and not out.requires_grad
    assert "LinearBf16Backward" in type(layer(x).grad_fn).__name__


def test_selective_head_gradients_in_bf16_are_close_to_fp32() -> None:
    generator = torch.Generator().manual_seed(2)
    hidden = torch.randn(20, 16, generator=generator, requires_grad=True)
    weight = torch.randn(40, 16, generator=generator, requires_grad=True)
    targets = torch.randint(0, 40, (20,), generator=generator)
    fp32 = token_logprob_head.project_token_logprobs(hidden, weight, targets, 6, torch.float32)
    fp32_grads = torch.autograd.grad(fp32.sum(), (hidden, weight))
    mixed = token_logprob_head.project_token_logprobs(hidden, weight, targets, 6, torch.float32, torch.bfloat16)
    mixed_grads = torch.autograd.grad(mixed.sum(), (hidden, weight))
    assert torch.equal(mixed, fp32)
    for got, expected in zip(mixed_grads, fp32_grads, strict=True):
        assert got.dtype == torch.float32
        assert (got - expected).abs().max() / expected.abs().max() < 0.02


@pytest.mark.parametrize(
    ("compute", "setting", "device", "expected"),
    [
        (torch.float32, "float32", "cpu", torch.float32),
        (torch.float32, "bfloat16", "cpu", torch.bfloat16),
        (torch.bfloat16, "float32", "cpu", torch.bfloat16),  # a bf16 policy's backward is bf16 anyway
        (torch.bfloat16, "auto", "cpu", torch.bfloat16),
    ],
)
def test_backward_dtype_follows_the_setting(compute, setting, device, expected) -> None:
    assert backward_dtype(compute, setting, torch.device(device)) == expected


def test_auto_follows_the_cpu_flags() -> None:
    expected = torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    assert backward_dtype(torch.float32, "auto", torch.device("cpu")) == expected
