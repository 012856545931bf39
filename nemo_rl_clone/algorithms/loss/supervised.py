"""Losses of the supervised algorithms: SFT's `NLLLossFn`, reward models' Bradley-Terry `PreferenceLossFn` and
`DPOLossFn`. The call contract (NeMo-RL's) is in `loss_functions`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from nemo_rl_clone.algorithms.loss.common import Metrics, masked_diff, masks, require_keys, shifted
from nemo_rl_clone.algorithms.loss.configs import DPOLossConfig, as_loss_config
from nemo_rl_clone.algorithms.utils import masked_mean
from nemo_rl_clone.contract.loss import LossType, TokenLogprobs
from nemo_rl_clone.contract.loss_input import policy_logprobs


def _sequence_nll(lp: torch.Tensor, mask: torch.Tensor, average: bool) -> torch.Tensor:
    """[B] −Σ_t lp·mask per row, ÷ the row's mask count (at least 1) when ``average``."""
    per_row = -torch.where(mask > 0, lp, 0.0).mul(mask).sum(dim=-1)
    return per_row / mask.sum(dim=-1).clamp(min=1) if average else per_row


class NLLLossFn:
    """Token-level negative log-likelihood for SFT: −Σ lp·m / global_valid_toks.

    With ``dpo_loss=True`` (NeMo-RL's DPO helper mode, keyword-only here) the loss is instead the [B] per-row
    −Σ_t lp·m (÷ the row's token count with ``dpo_average_log_probs``); the metrics' ``loss`` is its sum (a number,
    like every metric here; NeMo-RL puts the tensor there).

    Data keys: input_ids, token_mask, sample_mask. Metrics: `loss`, `num_unmasked_tokens` (local Σ m),
    `num_valid_samples` (local Σ sample_mask).
    """

    loss_type = LossType.TOKEN_LEVEL
    accepts_token_logprobs = True

    def __init__(self, use_linear_ce_fusion: bool = False) -> None:
        # NeMo-RL's flag that the Megatron worker fuses the LM head into the loss (megatron_cfg.use_linear_ce_fusion_loss).
        # Here every worker hands this loss token logprobs either way (TokenLogprobs), so it changes nothing.
        self.use_linear_ce_fusion = use_linear_ce_fusion

    def __call__(
        self,
        next_token_logits: torch.Tensor | TokenLogprobs,
        data: Mapping[str, Any],
        global_valid_seqs: torch.Tensor | None,
        global_valid_toks: torch.Tensor,
        vocab_parallel_rank: int | None = None,
        vocab_parallel_group: dist.ProcessGroup | None = None,
        context_parallel_group: dist.ProcessGroup | None = None,
        logprob_chunk_size: int | None = None,
        *,
        dpo_loss: bool = False,
        dpo_average_log_probs: bool = False,
    ) -> tuple[torch.Tensor, Metrics]:
        require_keys(data, ("input_ids", "token_mask", "sample_mask"), type(self).__name__)
        lp = policy_logprobs(
            next_token_logits,
            data,
            vocab_parallel_rank,
            vocab_parallel_group,
            context_parallel_group,
            logprob_chunk_size,
        )
        _, sample_mask, mask = masks(data, lp)
        if dpo_loss:
            loss = _sequence_nll(lp, mask, dpo_average_log_probs)
        else:
            loss = -masked_mean(lp, mask, global_normalization_factor=global_valid_toks)
        return loss, {
            "loss": loss.sum().item(),
            "num_unmasked_tokens": mask.sum().item(),
            "num_valid_samples": sample_mask.sum().item(),
        }


def _split_pairs(
    values: torch.Tensor, sample_mask: torch.Tensor, owner: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(chosen = values[::2], rejected = values[1::2], pair mask) of an interleaved preference batch."""
    if values.shape[0] % 2:
        raise ValueError(
            f"{owner}: rows interleave chosen/rejected, so the batch size must be even, got {values.shape[0]}"
        )
    pair_mask = sample_mask[::2]
    mismatch = (pair_mask != sample_mask[1::2]).nonzero()
    if mismatch.numel():
        row = 2 * mismatch[0].item()
        raise ValueError(
            f"{owner}: sample_mask of chosen row {row} and rejected row {row + 1} differ; mask a pair together"
        )
    return values[::2], values[1::2], pair_mask


def _bradley_terry(
    rewards: torch.Tensor, sample_mask: torch.Tensor, global_valid_seqs: torch.Tensor, beta: float, owner: str
) -> tuple[torch.Tensor, Metrics]:
    """−log σ(β(R_chosen − R_rejected)) summed over valid pairs / global pair count, and its metrics."""
    chosen, rejected, pair_mask = _split_pairs(rewards, sample_mask, owner)
    global_pairs = torch.as_tensor(global_valid_seqs, dtype=torch.float32, device=rewards.device) / 2

    def pair_share(values: torch.Tensor) -> torch.Tensor:
        return masked_mean(values, pair_mask, global_normalization_factor=global_pairs)

    loss = pair_share(-F.logsigmoid(beta * (chosen - rejected)))
    with torch.no_grad():
        metrics: Metrics = {
            "accuracy": pair_share((chosen > rejected).float()).item(),
            "rewards_chosen_mean": pair_share(chosen.detach()).item(),
            "rewards_rejected_mean": pair_share(rejected.detach()).item(),
            "num_valid_samples": pair_mask.sum().item(),
        }
    return loss, metrics


class PreferenceLossFn:
    """Bradley-Terry reward-model loss: −log σ(s_chosen − s_rejected), per pair, / (global_valid_seqs / 2).

    Same call signature as the other losses, but the first argument is the [B, 1] (or [B]) scalar scores of a
    sequence-classification head, not next-token logits. Rows interleave chosen/rejected (`[::2]`, `[1::2]`);
    `global_valid_seqs` counts rows, so it is twice the number of pairs. Data key: sample_mask (a pair's two rows
    must share it). Metrics: `loss`, `accuracy` (s_c > s_r), `rewards_chosen_mean`, `rewards_rejected_mean` (mean
    scores), `num_valid_samples` (local number of valid pairs).
    """

    loss_type = LossType.SEQUENCE_LEVEL
    rows_per_example = 2  # a policy keeps each (chosen, rejected) pair adjacent in one microbatch

    def split_output_tensor(self, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(chosen rows, rejected rows) of an interleaved [2·P, ...] tensor (NeMo-RL's helper)."""
        return tensor[::2], tensor[1::2]

    def __call__(
        self,
        logits: torch.Tensor,
        data: Mapping[str, Any],
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor | None = None,
        vocab_parallel_rank: int | None = None,
        vocab_parallel_group: dist.ProcessGroup | None = None,
        context_parallel_group: dist.ProcessGroup | None = None,
        logprob_chunk_size: int | None = None,
    ) -> tuple[torch.Tensor, Metrics]:
        require_keys(data, ("sample_mask",), type(self).__name__)
        scores = logits.float()
        if scores.dim() == 2 and scores.shape[-1] == 1:
            scores = scores.squeeze(-1)
        if scores.dim() != 1:
            raise ValueError(f"PreferenceLossFn: scores must be [B, 1] or [B], got {tuple(logits.shape)}")
        sample_mask = data["sample_mask"].to(device=scores.device, dtype=torch.float32)
        loss, metrics = _bradley_terry(scores, sample_mask, global_valid_seqs, 1.0, type(self).__name__)
        return loss, {"loss": loss.item(), **metrics}


class DPOLossFn:
    """DPO (Rafailov et al., 2023) with an optional SFT term on the chosen responses.

    R = Σ_t (lp − lp_ref)·token_mask (÷ the token count when `preference_average_log_probs`), per row;
    preference loss = −log σ(β(R_chosen − R_rejected)) per pair; SFT loss = −Σ_t lp·token_mask of the chosen
    row (÷ its token count when `sft_average_log_probs`); each summed over valid pairs / (global_valid_seqs / 2);
    loss = preference_loss_weight·preference + sft_loss_weight·sft; β = `reference_policy_kl_penalty`.

    Rows interleave chosen/rejected (`[::2]`, `[1::2]`); a pair's rows must share sample_mask. Data keys:
    input_ids, token_mask, sample_mask, reference_policy_logprobs ([B, S], the policy's layout). Metrics: `loss`,
    `sft_loss` and `preference_loss` (unweighted; sft_loss is reported even with weight 0), `accuracy`
    (R_c > R_r), `rewards_chosen_mean` / `rewards_rejected_mean` (mean R, without β), `num_valid_samples`
    (local number of valid pairs).
    """

    loss_type = LossType.SEQUENCE_LEVEL
    rows_per_example = 2  # a policy keeps each (chosen, rejected) pair adjacent in one microbatch

    accepts_token_logprobs = True

    def __init__(
        self, cfg: Mapping[str, Any] | DPOLossConfig | None = None, use_linear_ce_fusion: bool = False
    ) -> None:
        self.use_linear_ce_fusion = use_linear_ce_fusion  # as NLLLossFn's: changes nothing here
        self.cfg = as_loss_config(DPOLossConfig, cfg, "DPOLossFn")

    def __call__(
        self,
        next_token_logits: torch.Tensor | TokenLogprobs,
        data: Mapping[str, Any],
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor | None = None,
        vocab_parallel_rank: int | None = None,
        vocab_parallel_group: dist.ProcessGroup | None = None,
        context_parallel_group: dist.ProcessGroup | None = None,
        logprob_chunk_size: int | None = None,
    ) -> tuple[torch.Tensor, Metrics]:
        owner = type(self).__name__
        require_keys(data, ("input_ids", "token_mask", "sample_mask", "reference_policy_logprobs"), owner)
        lp = policy_logprobs(
            next_token_logits,
            data,
            vocab_parallel_rank,
            vocab_parallel_group,
            context_parallel_group,
            logprob_chunk_size,
        )
        token_mask, sample_mask, _ = masks(data, lp)
        valid = token_mask > 0
        num_tokens = token_mask.sum(dim=-1).clamp(min=1)

        rewards = masked_diff(lp, shifted(data, "reference_policy_logprobs", lp), valid).sum(dim=-1)
        if self.cfg.preference_average_log_probs:
            rewards = rewards / num_tokens
        preference_loss, metrics = _bradley_terry(
            rewards, sample_mask, global_valid_seqs, self.cfg.reference_policy_kl_penalty, owner
        )

        sft_per_row = _sequence_nll(lp, token_mask, self.cfg.sft_average_log_probs)
        global_pairs = torch.as_tensor(global_valid_seqs, dtype=torch.float32, device=lp.device) / 2
        sft_loss = masked_mean(sft_per_row[::2], sample_mask[::2], global_normalization_factor=global_pairs)

        loss = self.cfg.preference_loss_weight * preference_loss + self.cfg.sft_loss_weight * sft_loss
        return loss, {
            "loss": loss.item(),
            "sft_loss": sft_loss.item(),
            "preference_loss": preference_loss.item(),
            **metrics,
        }
