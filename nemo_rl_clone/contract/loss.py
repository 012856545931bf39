"""The loss protocol: what a policy worker calls a loss with and reads back (NeMo-RL v0.7.0 has it at
``nemo_rl.algorithms.loss.interfaces``). `LossFunction` is the call contract, `LossType` which global count a loss
divides by, `TokenLogprobs` what a loss that declares ``accepts_token_logprobs`` gets instead of the logits. The
math a worker applies a loss with is beside it: token logprobs in `nemo_rl_clone.contract.logprobs`, global valid
counts in `nemo_rl_clone.distributed.model_utils`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist


class LossType(enum.Enum):
    """Which global count a loss divides by (`global_valid_toks` or `global_valid_seqs`)."""

    TOKEN_LEVEL = "token_level"
    SEQUENCE_LEVEL = "sequence_level"


class LossInputType(enum.Enum):
    """NeMo-RL's kinds of loss input. Here a loss's ``accepts_token_logprobs`` says what it gets (`TokenLogprobs`
    for LOGPROB, the logits for LOGIT and DISTILLATION); the CROSS_TOKENIZER and DRAFT kinds are of features not
    built here (cross-tokenizer distillation, EAGLE draft models)."""

    LOGIT = "logit"
    LOGPROB = "logprob"
    DISTILLATION = "distillation"
    DISTILLATION_CROSS_TOKENIZER = "distillation_cross_tokenizer"
    DRAFT = "draft"


@dataclass(frozen=True)
class TokenLogprobs:
    """What a policy hands a loss instead of ``next_token_logits`` when the loss declares
    ``accepts_token_logprobs = True``: ``values`` ``[B, S - 1]`` fp32, laid out like `token_logprobs_from_logits`'
    output, differentiable, and computed only where ``token_mask[:, 1:]`` is set (0 elsewhere). Such a loss must
    read the logits through those logprobs alone (it gets no vocabulary-wide logits to take an entropy of).
    ``values`` are under the loss's ``sampling_params``; ``unfiltered``, given when the loss sets
    ``needs_unfiltered_logprobs``, under their temperature alone (a KL term's distribution)."""

    values: torch.Tensor
    unfiltered: torch.Tensor | None = None


class LossFunction(Protocol):
    """The call contract every loss handed to a policy worker follows.

    `loss_fn(next_token_logits, data, global_valid_seqs, global_valid_toks, ...) -> (loss, metrics)`,
    where `loss` is this microbatch's share of the global mean (see `valid_counts`) and every metric,
    summed over the microbatches of one global batch and over data-parallel ranks, gives its global value.
    `logprob_chunk_size` is `token_logprobs_from_logits`'s `chunk_size` (``policy.logprob_chunk_size``).
    """

    loss_type: LossType

    def __call__(
        self,
        next_token_logits: torch.Tensor,
        data: Mapping[str, Any],
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
        /,  # positional: a reward-model loss reads scores, not next-token logits, and names them so
        vocab_parallel_rank: int | None = None,
        vocab_parallel_group: dist.ProcessGroup | None = None,
        context_parallel_group: dist.ProcessGroup | None = None,
        logprob_chunk_size: int | None = None,
    ) -> tuple[torch.Tensor, dict[str, float | int]]: ...
