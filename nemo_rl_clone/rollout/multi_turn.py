"""Rollouts: generate, hand finished turns to their environments, append observations, repeat (docs/grpo.md).

Single-turn generation is the one-turn case of `run_multi_turn_rollout`. Generated token ids are appended to the
conversation exactly as the engine produced them (never decoded and re-encoded), together with the engine's
logprobs, so training sees the very tokens that were sampled.

NeMo-RL's two steps of a turn are here too, for code that writes its own loop: `generate_responses` (one generation
call, answers appended to the message logs) and `calculate_rewards` (every sample's environment step).
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ray
import torch
from transformers import PreTrainedTokenizerBase

from nemo_rl_clone.contract.episode import GENERATION_LOGPROBS
from nemo_rl_clone.data.interfaces import ROUTED_EXPERTS, merge_routing
from nemo_rl_clone.data.llm_message_utils import (
    batched_message_log_to_flat_message,
    message_from_token_ids,
    observation_message,
)
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.environments.interfaces import EnvironmentReturn, reward_component_keys
from nemo_rl_clone.models.generation.interfaces import GenerationInterface
from nemo_rl_clone.utils import watchdog

# A sample's environment return: (observation, metadata, next stop strings, reward, done, extracted answer).
_EnvReturn = tuple[dict[str, Any], Any, Any, torch.Tensor, bool, str | None]


def run_multi_turn_rollout(
    policy_generation: GenerationInterface,
    input_batch: BatchedDataDict,
    tokenizer: PreTrainedTokenizerBase,
    task_to_env: Mapping[str, Any],
    max_seq_len: int,
    max_rollout_turns: int = 999999,  # NeMo-RL's default: until every episode ends (the runs here pass theirs)
    greedy: bool = False,
) -> tuple[BatchedDataDict, dict[str, float]]:
    """Roll out every sample of ``input_batch`` (from ``rl_collate_fn``) until it terminates.

    A sample stops when its environment says so, when the engine hit its token limit (``truncated``), when the
    conversation reaches ``max_seq_len`` tokens (an observation that does not fit is cut at ``max_seq_len`` and the
    sample marked ``truncated``), or after ``max_rollout_turns`` turns. Rewards are summed over
    turns.

    Args:
        task_to_env: ``task_name`` → environment actor handle (``step.remote(message_logs, metadata)``).

    An optional ``seeds`` entry (ints, one per sample) makes sampling reproducible per sample.

    Returns:
        ``(batch, metrics)``: the input batch (message logs deep-copied, then extended) plus ``total_reward``
        ``[B]`` float, ``truncated`` ``[B]`` bool, ``turns`` ``[B]`` long, ``extracted_answers`` (B answers the
        environment extracted from each sample's last scored turn, ``None`` where it found none) and, when an
        environment returns K rewards per sample (``[B, K]``), ``reward1`` .. ``rewardK`` ``[B]`` float, each summed
        over turns (``total_reward`` is their sum; samples of single-reward environments get 0 in each); metrics
        ``mean_turns``, ``truncation_rate``, ``mean_generation_length``, ``total_generated_tokens``,
        ``natural_termination_rate``, and each environment's own metrics of its episodes as ``env/<name>/<metric>``.
    """
    rollout = _Rollout.start(input_batch, task_to_env)
    for turn in range(max_rollout_turns):
        active = rollout.generate_turn(policy_generation, tokenizer, max_seq_len, turn, greedy)
        if not active:
            break
        rollout.take_env_returns(_step_environments(rollout.batch, active, task_to_env), tokenizer, max_seq_len)
    return rollout.finish(task_to_env)


@dataclass
class _Rollout:
    """One batch's rollout in progress: its conversations (``batch``) and per-sample bookkeeping."""

    batch: BatchedDataDict
    stop_strings: list[Any]
    total_reward: torch.Tensor
    truncated: torch.Tensor
    terminated: torch.Tensor
    turns: torch.Tensor
    extracted_answers: list[str | None]
    components: torch.Tensor | None = None  # [B, K] once an environment returns K rewards per sample
    generated_tokens: int = 0

    @classmethod
    def start(cls, input_batch: BatchedDataDict, task_to_env: Mapping[str, Any]) -> _Rollout:
        """The input batch with its message logs deep-copied (every message with its engine logprobs)."""
        batch = BatchedDataDict(input_batch.copy())
        batch["message_log"] = copy.deepcopy(list(input_batch["message_log"]))
        batch["extra_env_info"] = copy.deepcopy(list(input_batch["extra_env_info"]))
        size = batch.size
        missing_envs = sorted(set(batch["task_name"]) - set(task_to_env))
        if missing_envs:
            raise KeyError(f"no environment for task_name {missing_envs}; environments given: {sorted(task_to_env)}")
        for log in batch["message_log"]:
            for message in log:
                message.setdefault(GENERATION_LOGPROBS, torch.zeros(len(message["token_ids"]), dtype=torch.float32))
        return cls(
            batch=batch,
            stop_strings=list(batch.get("stop_strings") or [None] * size),
            total_reward=torch.zeros(size, dtype=torch.float32),
            truncated=torch.zeros(size, dtype=torch.bool),
            terminated=torch.zeros(size, dtype=torch.bool),
            turns=torch.zeros(size, dtype=torch.long),
            extracted_answers=[None] * size,
        )

    def generate_turn(
        self, policy_generation: GenerationInterface, tokenizer: Any, max_seq_len: int, turn: int, greedy: bool
    ) -> list[int]:
        """Generate one turn for every sample still running that has room left; returns those samples (none: the
        rollout is over)."""
        batch, size = self.batch, self.batch.size
        active = [i for i in range(size) if not (self.terminated[i] or self.truncated[i])]
        if not active:
            return []
        flat, input_lengths = batched_message_log_to_flat_message(
            [batch["message_log"][i] for i in active], pad_value_dict={"token_ids": tokenizer.pad_token_id}
        )
        room = max_seq_len - input_lengths
        for j in (room <= 0).nonzero().flatten().tolist():  # no space left to generate: the sample is over
            self.truncated[active[j]] = True
        keep = [j for j in range(len(active)) if room[j] > 0]
        if not keep:
            return []
        active = [active[j] for j in keep]
        gen_input = BatchedDataDict(
            input_ids=flat["token_ids"][keep],
            input_lengths=input_lengths[keep],
            stop_strings=[self.stop_strings[i] for i in active],
        )
        seeds = batch.get("seeds")
        if seeds is not None:  # reproducible sampling per sample (and a different draw each turn)
            gen_input["seeds"] = [int(seeds[i]) + turn for i in active]
        outputs = policy_generation.generate(gen_input, greedy=greedy)
        for j, i in enumerate(active):
            start, length = int(input_lengths[keep[j]]), int(outputs["generation_lengths"][j])
            message = message_from_token_ids("assistant", outputs["output_ids"][j, start : start + length], tokenizer)
            message[GENERATION_LOGPROBS] = outputs["logprobs"][j, start : start + length].to(torch.float32)
            batch["message_log"][i].append(message)
            if ROUTED_EXPERTS in outputs:  # router replay: per sample, each position as the engine first routed it
                records = batch.setdefault(ROUTED_EXPERTS, [None] * size)
                records[i] = merge_routing(records[i], outputs[ROUTED_EXPERTS][j, : start + length])
            self.generated_tokens += length
            self.turns[i] += 1
            if bool(outputs["truncated"][j]) or start + length >= max_seq_len:
                self.truncated[i] = True
        return active

    def take_env_returns(
        self, env_returns: dict[int, _EnvReturn], tokenizer: PreTrainedTokenizerBase, max_seq_len: int
    ) -> None:
        """Add each sample's reward, and append the observation of each sample that goes on."""
        for i, (observation, metadata, next_stops, reward, done, answer) in env_returns.items():
            self.total_reward[i] += float(reward.sum())
            if reward.dim() == 1:
                self._add_components(i, reward)
            self.extracted_answers[i] = answer
            self.batch["extra_env_info"][i] = metadata if metadata is not None else self.batch["extra_env_info"][i]
            if done:
                self.terminated[i] = True
                continue
            if self.truncated[i]:
                continue
            self.stop_strings[i] = next_stops
            self._append_observation(i, observation, tokenizer, max_seq_len)

    def _add_components(self, i: int, reward: torch.Tensor) -> None:
        if self.components is None:
            self.components = torch.zeros(self.batch.size, reward.numel(), dtype=torch.float32)
        if self.components.shape[1] != reward.numel():
            raise ValueError(
                f"environments returned {self.components.shape[1]} and {reward.numel()} rewards per sample in one "
                f"batch (task {self.batch['task_name'][i]!r}); every multi-reward environment of a run must return "
                "the same number"
            )
        self.components[i] += reward

    def _append_observation(
        self, i: int, observation: dict[str, Any], tokenizer: PreTrainedTokenizerBase, max_seq_len: int
    ) -> None:
        log = self.batch["message_log"][i]
        last = log[-1]["token_ids"]
        ended_with_eos = len(last) > 0 and int(last[-1]) == tokenizer.eos_token_id
        message = observation_message(observation, tokenizer, ended_with_eos)
        room_left = max_seq_len - sum(len(m["token_ids"]) for m in log)
        if len(message["token_ids"]) > room_left:  # the observation is cut to fit, and the sample ends here
            message["token_ids"] = message["token_ids"][: max(room_left, 0)]
            message["content"] = tokenizer.decode(message["token_ids"])
            self.truncated[i] = True
        message[GENERATION_LOGPROBS] = torch.zeros(len(message["token_ids"]), dtype=torch.float32)
        log.append(message)

    def finish(self, task_to_env: Mapping[str, Any]) -> tuple[BatchedDataDict, dict[str, float]]:
        batch, size = self.batch, self.batch.size
        batch["total_reward"] = self.total_reward
        batch["truncated"] = self.truncated
        batch["turns"] = self.turns
        batch["extracted_answers"] = self.extracted_answers
        batch["stop_strings"] = self.stop_strings
        if self.components is not None:
            for k in range(self.components.shape[1]):
                batch[f"reward{k + 1}"] = self.components[:, k].clone()
        metrics = {
            "mean_turns": self.turns.float().mean().item(),
            "truncation_rate": self.truncated.float().mean().item(),
            "natural_termination_rate": self.terminated.float().mean().item(),
            "total_generated_tokens": float(self.generated_tokens),
            "mean_generation_length": self.generated_tokens / max(1, size),
        }
        metrics.update(_environment_metrics(batch, task_to_env))
        return batch, metrics


def generate_responses(
    policy_generation: GenerationInterface,
    generation_input_data: BatchedDataDict,
    batch: BatchedDataDict,
    tokenizer: PreTrainedTokenizerBase,
    input_lengths: torch.Tensor,
    include_logprobs: bool = True,
    greedy: bool = False,
) -> tuple[BatchedDataDict, list[torch.Tensor], dict[str, Any]]:
    """NeMo-RL's one generation step: generate for ``generation_input_data`` (``input_ids``, ``input_lengths``; its
    ``stop_strings`` are set from ``batch``'s, or None per sample) and append each answer to ``batch["message_log"]``
    in place as an assistant message (content decoded without special tokens, the engine's token ids and, with
    ``include_logprobs``, its ``generation_logprobs``).

    Returns ``(batch, generated token ids per sample, metrics)``: ``mean_generation_length``,
    ``total_generated_tokens`` and, when the engine reports it, ``_response_truncated`` ([B] bool).
    """
    size = len(input_lengths)
    generation_input_data["stop_strings"] = batch["stop_strings"] if "stop_strings" in batch else [None] * size
    outputs = policy_generation.generate(generation_input_data, greedy=greedy)
    generated_ids = []
    for i in range(size):
        start, end = int(input_lengths[i]), int(outputs["unpadded_sequence_lengths"][i])
        generated_ids.append(outputs["output_ids"][i, start:end])
        message = message_from_token_ids("assistant", generated_ids[-1], tokenizer, skip_special_tokens=True)
        if include_logprobs and "logprobs" in outputs:
            message[GENERATION_LOGPROBS] = outputs["logprobs"][i, start:end]
        batch["message_log"][i].append(message)
    lengths = outputs["generation_lengths"]
    metrics: dict[str, Any] = {
        "mean_generation_length": lengths.float().mean().item(),
        "total_generated_tokens": lengths.sum().item(),
    }
    if "truncated" in outputs:
        metrics["_response_truncated"] = outputs["truncated"]
    return batch, generated_ids, metrics


def calculate_rewards(batch: BatchedDataDict, task_to_env: Mapping[str, Any]) -> EnvironmentReturn:
    """NeMo-RL's environment step of a whole batch: each sample's conversation and ``extra_env_info`` go to the
    environment of its ``task_name`` (all environments at once); the returns come back in the batch's order, with
    ``rewards`` [B] (or [B, K] from K-reward environments) and ``terminateds`` [B] bool."""
    missing = sorted(set(batch["task_name"]) - set(task_to_env))
    if missing:
        raise ValueError(f"no environment for task_name {missing}; environments given: {sorted(task_to_env)}")
    returns = _step_environments(batch, list(range(len(batch["message_log"]))), task_to_env)
    ordered = [returns[i] for i in range(len(returns))]
    return EnvironmentReturn(
        observations=[r[0] for r in ordered],
        metadata=[r[1] for r in ordered],
        next_stop_strings=[r[2] for r in ordered],
        rewards=torch.stack([r[3] for r in ordered]),
        terminateds=torch.tensor([r[4] for r in ordered], dtype=torch.bool),
        answers=[r[5] for r in ordered],
    )


def _environment_metrics(batch: BatchedDataDict, task_to_env: Mapping[str, Any]) -> dict[str, float]:
    """Each environment's own metrics of its episodes (``global_post_process_and_metrics``), as ``env/<name>/*``."""
    by_task: dict[str, list[int]] = defaultdict(list)
    for i, task in enumerate(batch["task_name"]):
        by_task[task].append(i)
    futures = {
        task: task_to_env[task].global_post_process_and_metrics.remote(
            {
                "rewards": batch["total_reward"][indices],
                "turns": batch["turns"][indices],
                "is_end": ~batch["truncated"][indices],
                **{key: batch[key][indices] for key in reward_component_keys(batch)},
            }
        )
        for task, indices in by_task.items()
    }
    for task, future in futures.items():
        watchdog.track_actor(future, task_to_env[task], "global_post_process_and_metrics")
    metrics = {}
    for task, future in futures.items():
        _, env_metrics = ray.get(future)
        metrics.update({f"env/{task}/{name}": float(value) for name, value in env_metrics.items()})
    return metrics


def _step_environments(
    batch: BatchedDataDict, active: list[int], task_to_env: Mapping[str, Any]
) -> dict[int, _EnvReturn]:
    """Send each active sample's conversation to its task's environment (all environments in parallel). A sample's
    reward is a 0-d tensor, or ``[K]`` from an environment with K rewards."""
    by_task: dict[str, list[int]] = defaultdict(list)
    for i in active:
        by_task[batch["task_name"][i]].append(i)
    futures = {
        task: task_to_env[task].step.remote(
            [batch["message_log"][i] for i in indices], [batch["extra_env_info"][i] for i in indices]
        )
        for task, indices in by_task.items()
    }
    for task, future in futures.items():
        watchdog.track_actor(future, task_to_env[task], "step")
    results: dict[int, _EnvReturn] = {}
    for task, future in futures.items():
        ret = ray.get(future)
        for k, i in enumerate(by_task[task]):
            results[i] = (
                ret.observations[k],
                ret.metadata[k],
                ret.next_stop_strings[k],
                torch.as_tensor(ret.rewards[k], dtype=torch.float32),
                bool(ret.terminateds[k]),
                None if ret.answers is None else ret.answers[k],  # NeMo-RL lets an environment return no answers
            )
    return results
