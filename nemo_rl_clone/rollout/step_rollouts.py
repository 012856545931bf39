"""Where a GRPO step's rollouts come from: generated on demand (synchronous GRPO) or taken from the replay buffer
that a trajectory collector keeps filling while the trainer trains (async GRPO, `async_grpo`).

Both sources give the step loop the same four calls, so `grpo_train` reads the same either way:

    rollouts = source.next(step)          # 1-4: generation and rewards (None: the collector ran out of data)
    ...                                   # 5-7: advantages, logprobs, training
    source.after_training(step, timer)    # sync: the engines' weights are stale; async: refit them now
    source.validate(step, timer, fn)      # fn() on engines that hold the newest weights
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.rollout.agent_rollouts import run_agent_rollout
from nemo_rl_clone.rollout.batches import combine_rollout_metrics, generation_seeds, select_groups
from nemo_rl_clone.rollout.config import reward_keys
from nemo_rl_clone.rollout.metrics import groups_with_signal
from nemo_rl_clone.rollout.multi_turn import run_multi_turn_rollout
from nemo_rl_clone.rollout.refit import refit_policy_generation
from nemo_rl_clone.rollout.rewards import process_rewards
from nemo_rl_clone.utils.progress import phase
from nemo_rl_clone.utils.timer import Timer

AGENT = "agent"  # the env section whose agent plays whole episodes (env.agent)

if TYPE_CHECKING:
    from nemo_rl_clone.rollout.run import RolloutRun


@dataclass
class StepRollouts:
    """One training step's rollouts with their rewards (before advantages).

    ``weight_version`` is the number of training steps behind the weights that generated them (a step trained with
    version ``step - 1`` weights on rollouts of version ``v`` trains on data ``step - 1 - v`` steps old).
    ``loader_state`` is the prompt loader's position right after this step's prompts were drawn: what a checkpoint
    taken after training on them must hold.
    """

    batch: BatchedDataDict
    rewards: torch.Tensor  # [B] scaled, then shaped: what the advantages are computed from
    rollout_metrics: dict[str, float]
    sampling_metrics: dict[str, float]
    generation_performance: dict[str, float]
    timing: dict[str, float]
    weight_version: int
    loader_state: dict[str, int]
    num_prompts: int = 0
    extra_metrics: dict[str, float] = field(default_factory=dict)


def generate_step_rollouts(
    c: RolloutRun, step: int, batches: Iterator[BatchedDataDict], weight_version: int
) -> StepRollouts:
    """Steps 1-4 of GRPO for ``step``: prompts × generations, rollouts, reward scaling then shaping (repeated while
    dynamic sampling still lacks groups whose unshaped rewards differ). Sampling seeds depend on (seed, step, batch, row)
    only, so a step's samples do not depend on which source generated them."""
    loop, timer = c.config.loop, Timer()
    cfg = reward_keys(loop)
    group_size = loop.num_generations_per_prompt
    rollouts, rewards, unshaped, per_batch_metrics = [], [], [], []
    for gen_batch in range(cfg.dynamic_sampling_max_gen_batches if cfg.use_dynamic_sampling else 1):
        prompts = next(batches).repeat_interleave(group_size)
        prompts["seeds"] = generation_seeds(loop.seed, step, gen_batch, prompts.size)
        with timer.time("generation"):
            batch, batch_metrics = roll_out(c, prompts)
        rollouts.append(batch)
        shaped, before_shaping = process_rewards(batch, cfg)
        rewards.append(shaped)
        unshaped.append(before_shaping)
        per_batch_metrics.append(batch_metrics)
        if not cfg.use_dynamic_sampling:
            break
        if int(groups_with_signal(torch.cat(unshaped), group_size).sum()) >= loop.num_prompts_per_step:
            break
    loader_state = c.dataloader.state_dict()
    generation_performance = c.generation.take_performance_metrics()
    rollout_metrics = combine_rollout_metrics(per_batch_metrics, [b.size for b in rollouts])
    batch = BatchedDataDict.from_batches(rollouts) if len(rollouts) > 1 else rollouts[0]
    step_rewards, signal_rewards = torch.cat(rewards), torch.cat(unshaped)
    sampling_metrics: dict[str, float] = {}
    if cfg.use_dynamic_sampling:
        surplus = int(groups_with_signal(signal_rewards, group_size).sum()) - loop.num_prompts_per_step
        sampling_metrics = {
            "dynamic_sampling_num_gen_batches": float(len(rollouts)),
            "dynamic_sampling_num_discarded_valid_samples": float(max(0, surplus) * group_size),
        }
        rows = select_groups(signal_rewards, group_size, loop.num_prompts_per_step, loop.fills_without_signal)
        batch, step_rewards = batch.select_indices(rows), step_rewards[rows]
    return StepRollouts(
        batch=batch,
        rewards=step_rewards,
        rollout_metrics=rollout_metrics,
        sampling_metrics=sampling_metrics,
        generation_performance=generation_performance,
        timing=timer.get_timing_metrics("sum"),
        weight_version=weight_version,
        loader_state=loader_state,
        num_prompts=batch.size // group_size,
    )


def roll_out(c: RolloutRun, prompts: BatchedDataDict) -> tuple[BatchedDataDict, dict[str, float]]:
    """One rollout of ``prompts`` (single- or multi-turn) with the engines as they are: (final batch, metrics)."""
    cfg = c.config
    c.generation.prepare_for_generation()
    if AGENT in c.task_to_env:  # the user's agent drives the episodes over HTTP (docs/agents.md)
        batch, metrics = run_agent_rollout(
            c.generation, prompts, c.tokenizer, c.task_to_env[AGENT], cfg.policy.max_total_sequence_length
        )
    else:
        batch, metrics = run_multi_turn_rollout(
            c.generation,
            prompts,
            c.tokenizer,
            c.task_to_env,
            max_seq_len=cfg.policy.max_total_sequence_length,
            max_rollout_turns=cfg.loop.max_rollout_turns,
        )
    c.generation.finish_generation()
    return batch, metrics


class RolloutSource(Protocol):
    """What the GRPO step loop asks of the place its rollouts come from."""

    def next(self, step: int, timer: Timer) -> StepRollouts | None: ...
    def after_training(self, step: int, timer: Timer) -> None: ...
    def validate(self, step: int, timer: Timer, run: Callable[[], Any]) -> Any: ...
    def close(self) -> None: ...

    @property
    def position(self) -> Any: ...  # the loader position a checkpoint saves (`state_dict`, `load_state_dict`)


class SyncRollouts:
    """Synchronous GRPO: every step generates with the weights the previous step trained."""

    def __init__(self, c: RolloutRun) -> None:
        self.c = c
        self.batches = iter(c.dataloader)
        self.weights_stale = c.state.step > 0  # a resumed policy differs from the model the engines loaded

    @property
    def position(self) -> Any:
        return self.c.dataloader

    def next(self, step: int, timer: Timer) -> StepRollouts | None:
        self._refresh(step, timer)
        phase(step, "generation")
        return generate_step_rollouts(self.c, step, self.batches, weight_version=step - 1)

    def after_training(self, step: int, timer: Timer) -> None:
        self.weights_stale = True

    def validate(self, step: int, timer: Timer, run: Callable[[], Any]) -> Any:
        self._refresh(step, timer)
        return run()

    def close(self) -> None:
        pass

    def _refresh(self, step: int, timer: Timer) -> None:
        if self.weights_stale:
            phase(step, "weight sync")
            refit(self.c, timer)
            self.weights_stale = False


def refit(c: RolloutRun, timer: Timer | None) -> float:
    """Copy the policy's weights into the engines (``policy.refit_buffer_size_gb`` bounds the transfer buckets)."""
    buffer_gb = c.config.policy.refit_buffer_size_gb
    bucket = {"bucket_bytes": int(buffer_gb * 2**30)} if buffer_gb else {}
    return refit_policy_generation(c.policy, c.generation, c.colocated, timer=timer, **bucket)
