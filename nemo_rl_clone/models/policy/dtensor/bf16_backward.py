"""fp32 forward, bf16 backward matmuls: most of bf16's speed on CPU without its logprob error.

A training step's matmuls are one third forward and two thirds backward (input and weight gradients). Running the
forward in bf16 moves a 135M model's token logprobs ~3.5% away from an fp32 engine's (``token_mult_prob_error``
~1.035 measured on SmolLM2), which clouds the one number that says the trainer and the engine agree. Running only
the backward's matmuls in bf16 leaves every logprob, ratio and loss exact fp32 and rounds only the gradient (whose
noise the optimizer averages anyway); master weights and optimizer state stay fp32.

`install` swaps the class of every ``nn.Linear`` in the decoder layers (names, sharding and tying unchanged).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class _LinearBf16Backward(torch.autograd.Function):
    """``F.linear`` whose input and weight gradients are computed from bf16 copies (fp32 results)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        grad_2d = grad_out.reshape(-1, grad_out.shape[-1])
        low = grad_2d.to(torch.bfloat16)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = (low @ weight.to(torch.bfloat16)).to(x.dtype).reshape(x.shape)
        if ctx.needs_input_grad[1]:
            grad_w = (low.t() @ x.reshape(-1, x.shape[-1]).to(torch.bfloat16)).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad_2d.sum(dim=0)
        return grad_x, grad_w, grad_b


class Bf16BackwardLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return super().forward(x)
        return _LinearBf16Backward.apply(x, self.weight, self.bias)


def install(model: nn.Module, skip: nn.Module | None = None) -> int:
    """Make every plain ``nn.Linear`` of ``model`` except ``skip`` (the LM head, which `token_logprob_head` runs)
    a `Bf16BackwardLinear`; returns how many."""
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear and module is not skip:
            module.__class__ = Bf16BackwardLinear
            count += 1
    return count
