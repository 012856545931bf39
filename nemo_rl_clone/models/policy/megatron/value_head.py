"""A scalar head in place of a Megatron GPT model's output layer: reward models and PPO's critic on the Megatron
backend (``reward_model_cfg``; NeMo-RL's Megatron value section, which leaves that key off, gets it too).

The head is Hugging Face's ``score`` layer (``*ForSequenceClassification`` with one label: ``[1, hidden]``, no bias),
kept whole on every tensor-parallel rank: one output column cannot be split over ranks. Every rank then computes the
same ``[S, B, 1]`` outputs and the same head gradient, so the gradient is not summed over those ranks (Megatron
counts such a parameter once in the gradient norm). Under sequence parallelism the hidden states arrive split along
the sequence: they are gathered first, and in the backward pass each rank keeps its own part of the (identical)
gradient instead of summing the ranks' copies.
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region


class ValueHead(torch.nn.Module):
    """Called as Megatron calls its output layer: ``(hidden [S, B, H], weight=None, ...) -> (outputs, None)``."""

    def __init__(self, hidden_size: int, sequence_parallel: bool, dtype: torch.dtype) -> None:
        super().__init__()
        # Named as Megatron's output layer names its weight: its checkpoint code looks for ``output_layer.weight``.
        self.weight = torch.nn.Parameter(torch.zeros(1, hidden_size, dtype=dtype))
        self.sequence_parallel = sequence_parallel  # GPTModel reads this attribute of its output layer

    def forward(self, hidden: torch.Tensor, weight: Any = None, **_unused: Any) -> tuple[torch.Tensor, None]:
        if self.sequence_parallel:
            hidden = gather_from_sequence_parallel_region(
                hidden, tensor_parallel_output_grad=False, group=parallel_state.get_tensor_model_parallel_group()
            )
        return torch.nn.functional.linear(hidden, self.weight), None


def is_value_head(model: Any) -> bool:
    """Whether this pipeline stage of a GPT model ends in a `ValueHead`."""
    return isinstance(getattr(model, "output_layer", None), ValueHead)


def install(model: Any, config: Any) -> None:
    """Replace ``model.output_layer`` (the last pipeline stage's vocabulary projection) by a `ValueHead`."""
    model.output_layer = ValueHead(config.hidden_size, config.sequence_parallel, config.params_dtype)
