"""On-policy distillation loss: the student's KL to a teacher's top-k next-token distribution (`DistillationLossFn`).

Call contract: the one in `loss_functions` (NeMo-RL's),

    loss, metrics = loss_fn(next_token_logits, data, global_valid_seqs, global_valid_toks, ...)

- ``next_token_logits``: the student's ``[B, S, V]`` logits (position t predicts token t+1); a DTensor is gathered.
  They are divided by the student's sampling temperature (``sampling_params``), as the teacher's top-k logits are
  by the teacher's (`Policy.get_topk_logits`).
- ``data``: ``input_ids`` ``[B, S]``, ``token_mask`` ``[B, S]``, ``sample_mask`` ``[B]``, and the teacher's top-k at
  every position, ``teacher_topk_logits`` ``[B, S, k]`` (float) and ``teacher_topk_indices`` ``[B, S, k]`` (vocab
  ids), as `Policy.get_topk_logits` returns them. Position t of both is aligned with the logits of position t, so
  positions ``0 .. S-2`` are scored (the last predicts nothing), masked by ``token_mask[:, 1:] * sample_mask``.

Per scored position, with T = the teacher's top-k ids, q = softmax of the teacher's top-k logits over T, and the
student's distribution p either renormalised over T (``zero_outside_topk: false``) or its full-vocabulary softmax
read at T (``zero_outside_topk: true``):

    forward  KL(q || p) = Σ_T q (log q − log p)
    reverse  KL(p || q) = Σ_T p (log p − log q)  [+ Σ_{v∉T} p_v (log p_v + 100)  with zero_outside_topk]
    mixed    w · forward + (1 − w) · reverse          (w = mixed_kl_weight)

With ``zero_outside_topk`` the teacher puts probability e^-100 (nothing) on every token outside T, so a reverse KL
also charges the student for the mass it puts there; a forward KL has no such term (q is 0 there). The loss is the
microbatch's share of the token mean over the global batch (Σ per-token KL · mask / ``global_valid_toks``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from nemo_rl_clone.algorithms.loss.configs import as_loss_config
from nemo_rl_clone.algorithms.utils import masked_mean
from nemo_rl_clone.contract.loss import LossType
from nemo_rl_clone.contract.sampling import TrainingSamplingParams, scale
from nemo_rl_clone.utils.config_validation import SectionReads

__all__ = ["DistillationLossConfig", "DistillationLossDataDict", "DistillationLossFn"]

# log of the probability a zero_outside_topk teacher gives every token outside its top-k (NeMo-RL's constant)
LOG_INFINITESIMAL = -100.0


@dataclass(frozen=True)
class DistillationLossConfig(SectionReads):
    """`loss_fn` section of a distillation config (NeMo-RL's keys and its recipe's defaults)."""

    kl_type: Literal["forward", "reverse", "mixed"] = "forward"  # forward KL(teacher || student), reverse, or both
    mixed_kl_weight: float = 0.5  # mixed: the forward KL's weight, in [0, 1]
    zero_outside_topk: bool = False  # the student's full softmax read at the teacher's top k, not renormalised there

    def check(self) -> list[tuple[str, str]]:
        if not 0.0 <= self.mixed_kl_weight <= 1.0:
            return [("mixed_kl_weight", f"must be in [0, 1] (weight of the forward KL), got {self.mixed_kl_weight}")]
        return []


class DistillationLossDataDict(TypedDict):
    """The keys `DistillationLossFn` reads (shapes in the module docstring); NeMo-RL's name."""

    input_ids: torch.Tensor
    input_lengths: torch.Tensor
    token_mask: torch.Tensor
    sample_mask: torch.Tensor
    teacher_topk_logits: torch.Tensor
    teacher_topk_indices: torch.Tensor


class DistillationLossFn:
    """Forward / reverse / mixed KL of the student to the teacher's top-k distribution (see the module docstring).

    Args:
        cfg: a `DistillationLossConfig` (validated where the config was loaded, used as is) or NeMo-RL's ``loss_fn``
            mapping (missing keys take the defaults).

    Raises:
        ValueError: a mapping with an unknown key, a ``kl_type`` other than forward/reverse/mixed, or ``mixed_kl_weight`` outside
            [0, 1] (NeMo-RL asserts the same two).

    Metrics (each the microbatch's share, summed over microbatches by the trainer): ``loss``, ``kl_forward`` and
    ``kl_reverse`` (both directions whatever ``kl_type``, so runs with different losses compare), ``num_valid_samples``
    (local Σ sample_mask) and ``num_unmasked_tokens`` (local Σ mask).
    """

    loss_type = LossType.TOKEN_LEVEL

    def __init__(
        self,
        cfg: DistillationLossConfig | Mapping[str, Any] | None = None,
        sampling_params: TrainingSamplingParams | None = None,
    ) -> None:
        self.cfg = as_loss_config(DistillationLossConfig, cfg, "DistillationLossFn")
        # The student's sampling temperature: its logits are divided by it, as its sampler's were (no top-k/top-p:
        # the KL compares whole distributions).
        self.sampling_params = sampling_params.unfiltered() if sampling_params is not None else None
        self.kl_type = self.cfg.kl_type
        self.mixed_kl_weight = self.cfg.mixed_kl_weight
        self.zero_outside_topk = self.cfg.zero_outside_topk
        self.log_infinitesimal = LOG_INFINITESIMAL

    def __call__(
        self,
        next_token_logits: torch.Tensor,
        data: Mapping[str, Any],
        global_valid_seqs: torch.Tensor | None,
        global_valid_toks: torch.Tensor,
        vocab_parallel_rank: int | None = None,
        vocab_parallel_group: dist.ProcessGroup | None = None,
        context_parallel_group: dist.ProcessGroup | None = None,
        logprob_chunk_size: int | None = None,
    ) -> tuple[torch.Tensor, dict[str, float | int]]:
        missing = [
            k for k in ("token_mask", "sample_mask", "teacher_topk_logits", "teacher_topk_indices") if k not in data
        ]
        if missing:
            raise KeyError(f"DistillationLossFn: data is missing {missing} (teacher top-k: Policy.get_topk_logits)")
        if vocab_parallel_group is not None or context_parallel_group is not None:
            raise NotImplementedError(
                "DistillationLossFn: vocab- or context-parallel logits are not supported yet; use full logits"
            )
        logits = next_token_logits.full_tensor() if isinstance(next_token_logits, DTensor) else next_token_logits
        logits = scale(logits[:, :-1], self.sampling_params)  # [B, S-1, V] fp32, ÷ the sampling temperature
        indices = data["teacher_topk_indices"][:, :-1].to(logits.device, torch.long)  # [B, S-1, k]
        if indices.shape[-1] < 1:
            raise ValueError("DistillationLossFn: the teacher's top-k is empty (k must be >= 1)")
        teacher_lp = F.log_softmax(data["teacher_topk_logits"][:, :-1].to(logits.device, torch.float32), dim=-1)
        student_full_lp = F.log_softmax(logits, dim=-1) if self.zero_outside_topk else None
        if student_full_lp is not None:
            student_lp = student_full_lp.gather(-1, indices)
        else:
            student_lp = F.log_softmax(logits.gather(-1, indices), dim=-1)
        forward, reverse = kl_terms(teacher_lp, student_lp, student_full_lp)

        if self.kl_type == "forward":
            per_token = forward
        elif self.kl_type == "reverse":
            per_token = reverse
        else:
            per_token = self.mixed_kl_weight * forward + (1.0 - self.mixed_kl_weight) * reverse

        token_mask = data["token_mask"][:, 1:].to(logits.device, torch.float32)
        sample_mask = data["sample_mask"].to(logits.device, torch.float32)
        mask = token_mask * sample_mask.unsqueeze(-1)
        loss = masked_mean(per_token, mask, global_normalization_factor=global_valid_toks)
        with torch.no_grad():
            metrics: dict[str, float | int] = {
                "loss": loss.item(),
                "kl_forward": masked_mean(forward, mask, global_normalization_factor=global_valid_toks).item(),
                "kl_reverse": masked_mean(reverse, mask, global_normalization_factor=global_valid_toks).item(),
                "num_valid_samples": sample_mask.sum().item(),
                "num_unmasked_tokens": mask.sum().item(),
            }
        return loss, metrics


def kl_terms(
    teacher_lp: torch.Tensor, student_lp: torch.Tensor, student_full_lp: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position (forward KL(q || p), reverse KL(p || q)), each ``[...]``, from the teacher's and the student's
    logprobs at the teacher's top-k ``[..., k]``. With ``student_full_lp`` (the student's full-vocabulary logprobs
    ``[..., V]``: zero_outside_topk) the reverse KL adds the student's mass outside the top-k against the teacher's
    e^-100 there: Σ_{v∉T} p_v log p_v − LOG_INFINITESIMAL · P(v∉T)."""
    forward = (teacher_lp.exp() * (teacher_lp - student_lp)).sum(-1)
    student_p = student_lp.exp()
    reverse = (student_p * (student_lp - teacher_lp)).sum(-1)
    if student_full_lp is not None:
        neg_entropy_all = (student_full_lp.exp() * student_full_lp).sum(-1)
        neg_entropy_rest = neg_entropy_all - (student_p * student_lp).sum(-1)
        mass_rest = 1.0 - student_p.sum(-1)
        reverse = reverse + neg_entropy_rest - LOG_INFINITESIMAL * mass_rest
    return forward, reverse
