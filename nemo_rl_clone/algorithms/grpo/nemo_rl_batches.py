"""NeMo-RL v0.7.0's batch helpers of ``nemo_rl.algorithms.grpo``, for scripts that write their own step: reward
scaling, DAPO's dynamic sampling (PPO's too, on its ``ppo`` section), the prompt part of a message log, the loss
masks of generated messages, the sequence-level logprob-error filter and the rollout-metric reduction. Each takes
NeMo-RL's arguments (configs as dicts or as this library's typed sections) and runs on the code GRPO's own step uses
(`nemo_rl_clone.rollout.rewards`, `advantages.mask_logprob_mismatch`)."""

from __future__ import annotations

from typing import Any

import torch

from nemo_rl_clone.algorithms.grpo.advantages import mask_logprob_mismatch, sequence_mult_prob_error
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.environments.interfaces import reward_component_keys
from nemo_rl_clone.rollout import rewards as reward_transforms
from nemo_rl_clone.utils.config_sections import section_value
from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.utils.timer import Timer

__all__ = [
    "add_grpo_token_loss_masks_and_generation_logprobs",
    "aggregate_rollout_metrics",
    "compute_and_apply_seq_logprob_error_masking",
    "dynamic_sampling",
    "extract_initial_prompt_messages",
    "keep_groups_with_signal",
    "scale_rewards",
]

# NeMo-RL's defaults of the reward_scaling keys, in the order `rollout.rewards.scale_rewards` takes them.
_SCALING_KEYS = (("source_min", 0.0), ("source_max", 1.0), ("target_min", 0.0), ("target_max", 1.0))


def scale_rewards(repeated_batch: BatchedDataDict, reward_scaling_cfg: Any) -> BatchedDataDict:
    """With ``reward_scaling_cfg`` enabled, clamp ``repeated_batch["total_reward"]`` (and the reward components of a
    multi-reward environment) into [source_min, source_max] and map them linearly onto [target_min, target_max], in
    place; returns the batch. Missing bounds take NeMo-RL's defaults (0, 1, 0, 1)."""
    if not section_value(reward_scaling_cfg, "enabled", False):
        return repeated_batch
    bounds = [float(section_value(reward_scaling_cfg, key, default)) for key, default in _SCALING_KEYS]
    if bounds[1] <= bounds[0]:
        raise UserInputError(f"reward_scaling.source_max: must be > source_min ({bounds[1]} <= {bounds[0]})")
    for key in ("total_reward", *reward_component_keys(repeated_batch)):
        repeated_batch[key] = reward_transforms.scale_rewards(repeated_batch[key].float(), *bounds)
    return repeated_batch


def dynamic_sampling(
    repeated_batch: BatchedDataDict,
    std: torch.Tensor,
    baseline: torch.Tensor,
    dynamic_sampling_num_gen_batches: int,
    master_config: Any,
    timer: Timer,
    batch_cache: BatchedDataDict | None = None,
) -> tuple[BatchedDataDict, bool, BatchedDataDict | None, dict[str, int]]:
    """DAPO's dynamic sampling over ``master_config``'s ``grpo`` section (`keep_groups_with_signal`)."""
    loop = section_value(master_config, "grpo")
    return keep_groups_with_signal(
        loop, "grpo", repeated_batch, std, baseline, dynamic_sampling_num_gen_batches, timer, batch_cache
    )


def keep_groups_with_signal(
    loop: Any,
    section: str,
    repeated_batch: BatchedDataDict,
    std: torch.Tensor,
    baseline: torch.Tensor,
    num_gen_batches: int,
    timer: Timer,
    batch_cache: BatchedDataDict | None,
) -> tuple[BatchedDataDict, bool, BatchedDataDict | None, dict[str, int]]:
    """NeMo-RL's dynamic sampling step: ``(batch, is_batch_complete, batch_cache, metrics)``.

    ``std`` and ``baseline`` are per sample; the batch keeps them as ``"std"`` / ``"baseline"``. Without
    ``<section>.use_dynamic_sampling`` the batch is returned whole. With it, only samples whose ``std`` is not 0
    are kept (their rewards also as ``"filtered_reward"``) and added to ``batch_cache``; once the cache holds
    ``num_prompts_per_step * num_generations_per_prompt`` samples, the first that many are the batch (complete,
    the surplus counted as ``dynamic_sampling_num_discarded_valid_samples``); before that the batch is incomplete
    and the caller generates again, at most ``dynamic_sampling_max_gen_batches`` times (then one line names the key).
    """
    repeated_batch["baseline"] = baseline
    repeated_batch["std"] = std
    if not section_value(loop, "use_dynamic_sampling", False):
        return repeated_batch, True, batch_cache, {}
    needed = int(section_value(loop, "num_prompts_per_step")) * int(section_value(loop, "num_generations_per_prompt"))
    with timer.time("dynamic_sampling"):
        kept = repeated_batch.select_indices((std != 0.0).nonzero().flatten())
        kept["filtered_reward"] = kept["total_reward"]
        if kept.size > 0:
            batch_cache = kept if batch_cache is None else BatchedDataDict.from_batches([batch_cache, kept])
            kept = batch_cache
        if kept.size >= needed:
            return (
                kept.slice(0, needed),
                True,
                batch_cache,
                {"dynamic_sampling_num_discarded_valid_samples": kept.size - needed},
            )
        max_batches = int(section_value(loop, "dynamic_sampling_max_gen_batches", 10))
        if max_batches < 1:
            raise UserInputError(f"{section}.dynamic_sampling_max_gen_batches: must be > 0, got {max_batches}")
        if num_gen_batches > max_batches:
            raise UserInputError(
                f"{section}.dynamic_sampling_max_gen_batches: reached ({max_batches} generation batches) with "
                f"{kept.size} of the {needed} samples whose rewards differ in their group; raise it, use easier "
                "data or more generations per prompt"
            )
        return kept, False, batch_cache, {}


def extract_initial_prompt_messages(message_logs: list, original_prompt_lengths: torch.Tensor) -> list:
    """Each log's leading messages up to its original prompt's token count (``original_prompt_lengths[i]``): the
    prompt, assistant turns of a multi-turn prompt included, without what the rollout added."""
    prompts = []
    for message_log, prompt_length in zip(message_logs, original_prompt_lengths, strict=True):
        prompt, tokens = [], 0
        for message in message_log:
            if tokens >= int(prompt_length):
                break
            prompt.append(message)
            tokens += len(message["token_ids"])
        prompts.append(prompt)
    return prompts


def add_grpo_token_loss_masks_and_generation_logprobs(message_logs: list) -> None:
    """In place: ``token_loss_mask`` 1 on the tokens of generated messages (assistant messages that carry
    ``generation_logprobs``; an assistant turn of the prompt has none) and 0 elsewhere, and zero
    ``generation_logprobs`` (float32) on every message without them."""
    for message_log in message_logs:
        for message in message_log:
            token_ids = message["token_ids"]
            generated = message["role"] == "assistant" and "generation_logprobs" in message
            message["token_loss_mask"] = torch.full_like(token_ids, int(generated))
            if "generation_logprobs" not in message:
                message["generation_logprobs"] = torch.zeros_like(token_ids, dtype=torch.float32)


def compute_and_apply_seq_logprob_error_masking(
    train_data: BatchedDataDict, rewards: torch.Tensor, seq_logprob_error_threshold: float | None
) -> dict[str, float]:
    """Each training sample's token_mult_prob_error (`advantages.sequence_mult_prob_error`) summarised as
    ``min/mean/max_seq_mult_prob_error`` over the samples that train; with a threshold, the samples above it stop
    training (``train_data["sample_mask"]`` 0, in place) and the summary is repeated over those kept
    (``..._after_mask``), with ``num_masked_seqs`` and ``masked_correct_pct`` (the share of them whose reward was 1).
    Without one, the ``..._after_mask`` values equal the others and nothing is masked."""
    errors = sequence_mult_prob_error(train_data)
    trains = (train_data["token_mask"][:, 1:].sum(dim=-1) > 0) & (train_data["sample_mask"] > 0)
    before = _error_summary(errors, trains, "")
    if seq_logprob_error_threshold is None:
        return {
            **before,
            **_error_summary(errors, trains, "_after_mask"),
            "num_masked_seqs": 0,
            "masked_correct_pct": 0.0,
        }
    original = train_data["sample_mask"].clone()
    num_masked = mask_logprob_mismatch(train_data, seq_logprob_error_threshold)
    masked = (original > 0) & (train_data["sample_mask"] == 0)
    correct = float((rewards.reshape(-1)[masked] == 1).sum()) / num_masked if num_masked else 0.0
    after = _error_summary(errors, trains & (train_data["sample_mask"] > 0), "_after_mask")
    return {**before, **after, "num_masked_seqs": num_masked, "masked_correct_pct": correct}


def _error_summary(errors: torch.Tensor, rows: torch.Tensor, suffix: str) -> dict[str, float]:
    """max/mean/min of ``errors`` over ``rows`` (0 each when no row is selected)."""
    chosen = errors[rows]
    if chosen.numel() == 0:
        return {f"{stat}_seq_mult_prob_error{suffix}": 0.0 for stat in ("max", "mean", "min")}
    return {
        f"max_seq_mult_prob_error{suffix}": chosen.max().item(),
        f"mean_seq_mult_prob_error{suffix}": chosen.mean().item(),
        f"min_seq_mult_prob_error{suffix}": chosen.min().item(),
    }


def aggregate_rollout_metrics(per_group_metrics: dict[str, list]) -> dict[str, Any]:
    """One value per metric from per-group lists: ``.../min`` and ``min_...`` (not ``..._rate``) take the minimum,
    ``.../max`` and ``max_...`` the maximum, ``total_turns`` the sum, other numbers the mean; a list of
    non-numbers passes through as it is."""
    aggregated: dict[str, Any] = {}
    for name, values in per_group_metrics.items():
        if not values:
            raise UserInputError(f"per_group_metrics[{name!r}]: no values to aggregate")
        if not isinstance(values[0], int | float):
            aggregated[name] = values
        elif name.endswith("/min") or (name.startswith("min_") and not name.endswith("_rate")):
            aggregated[name] = min(values)
        elif name.endswith("/max") or (name.startswith("max_") and not name.endswith("_rate")):
            aggregated[name] = max(values)
        elif name == "total_turns":
            aggregated[name] = sum(values)
        else:
            aggregated[name] = sum(values) / len(values)
    return aggregated
