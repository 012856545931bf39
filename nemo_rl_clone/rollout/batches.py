"""Batch plumbing of a rollout step: sampling seeds, dynamic sampling's group choice, the training batch, metric
aggregation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from nemo_rl_clone.data.interfaces import ROUTED_EXPERTS, pad_routing
from nemo_rl_clone.data.llm_message_utils import add_loss_mask_to_message_log, batched_message_log_to_flat_message
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.rollout.config import RolloutRunConfig, reward_keys
from nemo_rl_clone.rollout.metrics import combine_batches, groups_with_signal, reduce_train_results
from nemo_rl_clone.utils.errors import UserInputError

# Loss metrics are each microbatch's share of the global mean (the call contract in `loss_functions`), so they add
# up over microbatches.
_SUMMED_LOSS_METRICS = (
    "loss",
    "probs_ratio",
    "probs_ratio_clamped",
    "kl_penalty",
    "token_mult_prob_error",
    "gen_kl_error",
    "policy_kl_error",
    "js_divergence_error",
    "sampling_importance_ratio",
    "is_oob_ratio",
    "approx_entropy",
)

# Rollout metrics that are totals over a batch; the others are per-sample means.
_ROLLOUT_COUNT_METRICS = ("total_generated_tokens",)


def generation_seeds(seed: int, step: int, gen_batch: int, size: int) -> list[int]:
    """Per-sample sampling seeds that depend only on (seed, step, batch, row): a resumed run samples the same."""
    base = (seed * 1_000_003 + step * 1_009 + gen_batch) * 65_536
    return [base + i for i in range(size)]


def training_sample_mask(batch: BatchedDataDict, overlong_filtering: bool) -> torch.Tensor:
    """``[B]`` 1 for the samples that train, 0 for the others (loss multiplier 0, or truncated with
    ``overlong_filtering``: a truncated response has no trustworthy reward)."""
    sample_mask = batch["loss_multiplier"].clone().float()
    if overlong_filtering:
        sample_mask = sample_mask * (~batch["truncated"]).float()
    return sample_mask


def select_groups(signal_rewards: torch.Tensor, group_size: int, num_groups: int, fill: bool) -> list[int]:
    """Dynamic sampling: the rows of ``num_groups`` prompt groups whose ``signal_rewards`` (unshaped) differ.

    With fewer such groups: ``fill`` takes groups without signal to complete the batch (their advantages are 0);
    otherwise the run stops with one line, as NeMo-RL does.
    """
    signal = groups_with_signal(signal_rewards, group_size)
    found = int(signal.sum())
    if found < num_groups and not fill:
        raise UserInputError(
            f"grpo.use_dynamic_sampling: only {found} of grpo.num_prompts_per_step={num_groups} prompt groups had "
            f"rewards that differ after grpo.dynamic_sampling_max_gen_batches generation batches; raise that limit, "
            "use easier data or more generations per prompt, or set grpo.dynamic_sampling_fill_without_signal=true "
            "to fill the batch with groups that train nothing"
        )
    order = signal.nonzero().flatten().tolist() + (~signal).nonzero().flatten().tolist()
    return [g * group_size + i for g in order[:num_groups] for i in range(group_size)]


def combine_rollout_metrics(per_batch: Sequence[Mapping[str, float]], sizes: Sequence[int]) -> dict[str, float]:
    """One step's rollout metrics over all its generation batches (dynamic sampling may draw several): per-sample
    means weighted by batch size, totals summed."""
    means = [name for name in per_batch[0] if name not in _ROLLOUT_COUNT_METRICS]
    return combine_batches(per_batch, means, _ROLLOUT_COUNT_METRICS, weights=[float(size) for size in sizes])


def build_train_batch(
    batch: BatchedDataDict, advantages: torch.Tensor, tokenizer: Any, cfg: RolloutRunConfig
) -> BatchedDataDict:
    """Flatten the conversations into ``[B, S]`` tensors for the policy (loss on assistant tokens only)."""
    message_logs = batch["message_log"]
    add_loss_mask_to_message_log(message_logs, roles_to_train_on=["assistant"])
    flat, lengths = batched_message_log_to_flat_message(
        message_logs,
        pad_value_dict={"token_ids": tokenizer.pad_token_id},
        make_sequence_length_divisible_by=cfg.policy.make_sequence_length_divisible_by,
    )
    sample_mask = training_sample_mask(batch, reward_keys(cfg.loop).overlong_filtering)
    token_ids = flat["token_ids"]
    train_data = BatchedDataDict(
        input_ids=token_ids,
        input_lengths=lengths,
        token_mask=flat["token_loss_mask"].float(),
        sample_mask=sample_mask,
        advantages=advantages.float()[:, None].expand(token_ids.shape).contiguous(),
        generation_logprobs=flat["generation_logprobs"].float(),
    )
    if ROUTED_EXPERTS in batch:  # router replay: ``[B, S, layers, k]``, -1 where the engine computed no routing
        train_data[ROUTED_EXPERTS] = pad_routing(batch[ROUTED_EXPERTS], token_ids.shape[1])
    return train_data


def training_metrics(train_results: Mapping[str, Any]) -> dict[str, float]:
    """The ``train/*`` metrics of one `Policy.train` result: loss, grad_norm, the loss's metrics, lr (the step
    replay compares these, docs/debugging.md)."""
    return reduce_train_results(train_results, _SUMMED_LOSS_METRICS)


def aggregate_train_metrics(
    train_results: dict[str, Any],
    train_data: BatchedDataDict,
    rewards: torch.Tensor,
    advantages: torch.Tensor,
    rollout_metrics: dict[str, float],
    task_rewards: torch.Tensor | None = None,
) -> dict[str, float]:
    """NeMo-RL's ``train/*`` metrics of one step (loss-type metrics averaged over the step's global batches).

    ``reward`` is the mean of the rewards the advantages came from (scaled and shaped, as NeMo-RL logs it);
    ``accuracy`` the share of samples whose environment reward (``task_rewards``, before scaling and shaping;
    default ``rewards``) is 1."""
    metrics = training_metrics(train_results)
    mask = train_data["token_mask"]
    prompt_lengths = train_data["input_lengths"] - mask.sum(dim=1)
    metrics.update(
        reward=rewards.mean().item(),
        accuracy=((rewards if task_rewards is None else task_rewards) == 1.0).float().mean().item(),
        mean_prompt_length=prompt_lengths.float().mean().item(),
        total_num_tokens=float(train_data["input_lengths"].sum()),
        generated_tokens=float(mask.sum()),
        num_valid_samples=float(train_data["sample_mask"].sum()),
        **{
            "advantages/mean": advantages.mean().item(),
            "advantages/max": advantages.max().item(),
            "advantages/min": advantages.min().item(),
        },
        **{f"rollout/{k}": v for k, v in rollout_metrics.items()},
    )
    return metrics
