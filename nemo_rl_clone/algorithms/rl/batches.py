"""Batch plumbing of a GRPO step: rewards from rollouts, the training batch, metric aggregation, sample dumps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from nemo_rl_clone.algorithms.advantage_estimator import (
    ESTIMATORS,
    AdvantageEstimator,
    ReinforcePlusPlusAdvantageEstimator,
    RLOOAdvantageEstimator,
)
from nemo_rl_clone.algorithms.reward_functions import response_length
from nemo_rl_clone.algorithms.rl.config import GRPOConfig, GRPOMasterConfig
from nemo_rl_clone.algorithms.utils import (
    combine_batches,
    groups_with_signal,
    masked_mean,
    reduce_train_results,
)
from nemo_rl_clone.data.llm_message_utils import add_loss_mask_to_message_log, batched_message_log_to_flat_message
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.utils.progress import console

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


def advantage_estimator(cfg: GRPOConfig) -> AdvantageEstimator:
    """The estimator ``grpo.adv_estimator`` names, built from its keys (the one place estimators are built)."""
    est = cfg.adv_estimator
    if est.name == "reinforce_plus_plus":
        return ReinforcePlusPlusAdvantageEstimator(est.minus_baseline)
    if est.name == "rloo":
        return RLOOAdvantageEstimator()
    return ESTIMATORS[est.name](leave_one_out=cfg.leave_one_out, normalize=cfg.normalize, std=est.std)


def step_advantages(rewards: torch.Tensor, cfg: GRPOConfig, batch: BatchedDataDict | None = None) -> torch.Tensor:
    """[B] advantages of one step: ``grpo.adv_estimator``'s, then clamped into [advantage_clip_low,
    advantage_clip_high]. ``batch``: its message logs give each sample's response length (REINFORCE++ weighs by
    them); without it every sample weighs 1."""
    if batch is None:
        lengths = torch.ones_like(rewards)
    else:
        lengths = torch.tensor([response_length(log) for log in batch["message_log"]], dtype=torch.float32)
    advantages = advantage_estimator(cfg).compute_advantage(rewards, cfg.num_generations_per_prompt, lengths)
    if cfg.advantage_clip_low is not None or cfg.advantage_clip_high is not None:
        advantages = advantages.clamp(min=cfg.advantage_clip_low, max=cfg.advantage_clip_high)
    return advantages


def mask_logprob_mismatch(train_data: BatchedDataDict, threshold: float) -> int:
    """Zero ``sample_mask`` of the samples whose token_mult_prob_error (mean over their trainable tokens of
    exp|lp_gen − lp_prev|) exceeds ``threshold``: the trainer and the generator disagree on them too much to trust
    the importance ratios. Returns how many samples it masked (samples masked already are not counted)."""
    token_mask = train_data["token_mask"][:, 1:]
    gap = (train_data["generation_logprobs"][:, 1:] - train_data["prev_logprobs"][:, 1:]).abs()
    error = masked_mean(torch.where(token_mask > 0, gap, 0.0).exp(), token_mask, dim=-1)
    drop = (error > threshold) & (train_data["sample_mask"] > 0)
    train_data["sample_mask"] = torch.where(drop, 0.0, train_data["sample_mask"])
    return int(drop.sum())


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
    batch: BatchedDataDict, advantages: torch.Tensor, tokenizer: Any, cfg: GRPOMasterConfig
) -> BatchedDataDict:
    """Flatten the conversations into ``[B, S]`` tensors for the policy (loss on assistant tokens only)."""
    message_logs = batch["message_log"]
    add_loss_mask_to_message_log(message_logs, roles_to_train_on=["assistant"])
    flat, lengths = batched_message_log_to_flat_message(
        message_logs,
        pad_value_dict={"token_ids": tokenizer.pad_token_id},
        make_sequence_length_divisible_by=cfg.policy.make_sequence_length_divisible_by,
    )
    sample_mask = batch["loss_multiplier"].clone().float()
    if cfg.grpo.overlong_filtering:  # a truncated response has no trustworthy reward: no gradient from it
        sample_mask = sample_mask * (~batch["truncated"]).float()
    token_ids = flat["token_ids"]
    return BatchedDataDict(
        input_ids=token_ids,
        input_lengths=lengths,
        token_mask=flat["token_loss_mask"].float(),
        sample_mask=sample_mask,
        advantages=advantages.float()[:, None].expand(token_ids.shape).contiguous(),
        generation_logprobs=flat["generation_logprobs"].float(),
    )


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


def sample_rows(
    batch: BatchedDataDict,
    rewards: torch.Tensor,
    advantages: torch.Tensor | None = None,
    tokenizer: Any = None,
    train_data: BatchedDataDict | None = None,
) -> list[dict[str, Any]]:
    """One JSON row per sample: prompt text (the messages before the first answer, template markup included),
    response text (everything from the first answer on: in a multi-turn episode the environment's replies too),
    reward, advantage (when given), the prompt's dataset index and ``truncated`` (the rollout's per-sample flag
    behind ``rollout/truncation_rate``, when the batch has it).

    With ``tokenizer``, each row also describes the response token by token (read by the rollout viewer,
    docs/rollout_viewer.md), with floats rounded to 4 decimals: ``tokens`` (each token's text, joining to the
    response), ``generation_logprobs`` (the engine's), ``segments`` (``[role, token count]`` per message: assistant
    turns and environment replies) and, with ``train_data`` (the step's training batch, rows in the same order),
    ``loss_mask`` (``token_mask`` × ``sample_mask``) and ``trainer_logprobs`` (``prev_logprobs``: only when the step
    computed them).
    """
    rows = []
    for i, log in enumerate(batch["message_log"]):
        first = next((k for k, m in enumerate(log) if m["role"] == "assistant"), len(log))
        prompt = "".join(m["content"] for m in log[:first])
        response = "".join(m["content"] for m in log[first:])
        row: dict[str, Any] = {"prompt": prompt, "response": response, "reward": float(rewards[i])}
        if advantages is not None:
            row["advantage"] = float(advantages[i])
        row["idx"] = batch["idx"][i]
        if "truncated" in batch:
            row["truncated"] = bool(batch["truncated"][i])
        if tokenizer is not None:
            row.update(_response_tokens(log, first, tokenizer, train_data, i))
        rows.append(row)
    return rows


def token_texts(token_ids: Sequence[int], tokenizer: Any) -> list[str]:
    """Each token's text, decoded one id after another so that the texts join to ``tokenizer.decode(token_ids)``.

    A token is decoded after a few tokens of context (decoding it alone would drop a SentencePiece word's leading
    space); a token ending inside a multi-byte character gets ``""`` and the character goes to the token that
    completes it.
    """
    ids = [int(t) for t in token_ids]
    texts: list[str] = []
    base, before = 0, ""  # `before` is the decoding of ids[base:k]
    for k in range(len(ids)):
        text = tokenizer.decode(ids[base : k + 1], skip_special_tokens=False)
        if text.endswith("\ufffd") and k + 1 < len(ids):  # an incomplete character: its next byte comes next
            texts.append("")
            continue
        texts.append(text[len(before) :] if text.startswith(before) else tokenizer.decode(ids[k : k + 1]))
        before = text
        if k + 1 - base > 2 * _DECODE_CONTEXT:  # keep every decode short: the cost stays linear in the length
            base = k + 1 - _DECODE_CONTEXT
            before = tokenizer.decode(ids[base : k + 1], skip_special_tokens=False)
    return texts


# Tokens decoded before the one whose text is wanted (see `token_texts`).
_DECODE_CONTEXT = 4


def _response_tokens(
    log: list[dict[str, Any]], first: int, tokenizer: Any, train_data: BatchedDataDict | None, row: int
) -> dict[str, Any]:
    """The per-token fields of `sample_rows` for the messages ``log[first:]``."""
    messages = log[first:]
    tokens = [text for m in messages for text in token_texts(m["token_ids"], tokenizer)]
    fields: dict[str, Any] = {
        "tokens": tokens,
        "segments": [[m["role"], len(m["token_ids"])] for m in messages],
    }
    if all("generation_logprobs" in m for m in messages):
        fields["generation_logprobs"] = _rounded(torch.cat([m["generation_logprobs"] for m in messages]))
    if train_data is not None:
        start = sum(len(m["token_ids"]) for m in log[:first])
        span = slice(start, start + len(tokens))
        mask = train_data["token_mask"][row, span] * train_data["sample_mask"][row]
        fields["loss_mask"] = [int(v > 0) for v in mask.tolist()]
        if "prev_logprobs" in train_data:
            fields["trainer_logprobs"] = _rounded(train_data["prev_logprobs"][row, span])
    return fields


def _rounded(values: torch.Tensor) -> list[float]:
    return [round(v, 4) for v in values.float().tolist()]


def print_samples(rows: list[dict[str, Any]], title: str) -> None:
    """Print prompt, response and reward of each row to the console (``logger.num_val_samples_to_print``).

    Model text is printed verbatim: rich markup and highlighting are off, so brackets in a response stay as is.
    """
    for i, row in enumerate(rows, start=1):
        console.print(f"{title} {i}/{len(rows)} (reward {row['reward']:g})", style="bold")
        console.print(f"  prompt: {row['prompt']}\n  response: {row['response']}", markup=False, highlight=False)
