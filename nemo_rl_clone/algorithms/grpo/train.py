"""GRPO: generate → reward → advantages → logprobs → train → sync → validate → checkpoint → log (see docs/grpo.md).

`GRPOSteps.train_step` is GRPO's step and reads top to bottom; the loop around it (schedule, validation, logging,
checkpoints, signals) is every algorithm's `run.loop.train_loop`. Building the run lives in `grpo.components`, the
step's advantages in `grpo.advantages`; the rollout machinery every RL algorithm shares is `nemo_rl_clone.rollout`:
where rollouts come from (on demand, or from async GRPO's replay buffer) in `step_rollouts` / `async_rollouts`, batch
plumbing in `batches`, the collapse monitors in `monitors`, repro bundles in `repro`.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from nemo_rl_clone.algorithms.grpo.advantages import mask_logprob_mismatch, step_advantages
from nemo_rl_clone.algorithms.grpo.components import GRPOComponents, GRPOState, setup
from nemo_rl_clone.algorithms.grpo.config import GRPOConfig, GRPOMasterConfig
from nemo_rl_clone.algorithms.grpo.step_rows import step_rows
from nemo_rl_clone.algorithms.run.loop import Schedule, StepResult, train_loop
from nemo_rl_clone.algorithms.run.rollout import (
    RolloutAlgorithm,
    log_validation,
    save_checkpoint,
    step_performance,
    validate,
)
from nemo_rl_clone.models.policy.workers.train_profile import memory_metrics, profile_metrics
from nemo_rl_clone.rollout.agent_rollouts import expand_agent_samples
from nemo_rl_clone.rollout.async_rollouts import AsyncRollouts
from nemo_rl_clone.rollout.batches import aggregate_train_metrics, build_train_batch
from nemo_rl_clone.rollout.monitors import CollapseMonitors
from nemo_rl_clone.rollout.repro import ReproBundles
from nemo_rl_clone.rollout.step_rollouts import RolloutSource, SyncRollouts
from nemo_rl_clone.utils.progress import phase
from nemo_rl_clone.utils.samples import sample_rows
from nemo_rl_clone.utils.timer import Timer

# NeMo-RL's names: `from nemo_rl_clone.algorithms.grpo import MasterConfig, setup, grpo_train`.
MasterConfig = GRPOMasterConfig
GRPOSaveState = GRPOState
__all__ = ["GRPOConfig", "GRPOSaveState", "MasterConfig", "grpo_train", "setup", "validate"]


def grpo_train(c: GRPOComponents) -> None:
    """Run GRPO steps until ``grpo.max_num_steps``, ``grpo.max_num_epochs``, the end of the collector's data or the
    save deadline (`run.loop.train_loop`). Rollouts come from `SyncRollouts`, or `AsyncRollouts` with
    ``grpo.async_grpo.enabled``."""
    train_loop(GRPOSteps(c))


class GRPOSteps:
    """GRPO's step for `train_loop`: sync and async GRPO differ only in their rollout source."""

    def __init__(self, c: GRPOComponents) -> None:
        cfg = c.config
        self.c, self.state, self.logger, self.checkpointer = c, c.state, c.logger, c.checkpointer
        self.checkpointing, self.watchdog, self.log_dir = cfg.checkpointing, cfg.watchdog, c.log_dir
        grpo = cfg.grpo
        self.schedule = Schedule.for_rollouts("GRPO", grpo)
        async_grpo = grpo.async_grpo
        self.source: RolloutSource = (
            AsyncRollouts(c, async_grpo.max_trajectory_age_steps, async_grpo.in_flight_weight_updates)
            if async_grpo.enabled
            else SyncRollouts(c)
        )
        self.monitors = CollapseMonitors(cfg.monitors, grpo.num_generations_per_prompt, c.state.monitors)
        self.repro = ReproBundles(c, self.monitors.alerting)

    @property
    def position(self) -> Any:
        return self.source.position

    def start(self, timer: Timer) -> None:
        pass

    def train_step(self, step: int, timer: Timer) -> StepResult | None:
        c, cfg = self.c, self.c.config
        # 1-4. prompts × generations with fresh (sync) or recent enough (async) weights, rollouts, rewards
        rollouts = self.source.next(step, timer)
        if rollouts is None:
            return None
        batch, rewards = rollouts.batch, rollouts.rewards

        # 5. advantages: leave-one-out baseline, normalised by the group std, optionally clipped
        advantages = step_advantages(rewards, cfg.grpo, batch, cfg.loss_fn)
        # an agent episode that rewrote its context trains as one sample per call, each with the episode's advantage
        samples, sample_rewards, sample_advantages, num_samples = expand_agent_samples(
            batch, rewards, advantages, cfg.policy.train_global_batch_size
        )
        train_data = build_train_batch(samples, sample_advantages, c.tokenizer, cfg)

        # 6-7. logprobs of the pre-update policy (unless the loss takes them on-policy from the training forward) and
        # of the reference policy (when the KL term is on), then training: the driver hands the workers the batch,
        # or with data_plane.enabled the keys of its rows in the queue (`step_rows`)
        train_results, num_masked = policy_passes(c, step, timer, train_data)
        threshold = cfg.grpo.seq_logprob_error_threshold

        metrics = aggregate_train_metrics(
            train_results, train_data, rewards, advantages, rollouts.rollout_metrics, batch["accuracy_reward"]
        )
        metrics.update(rollouts.sampling_metrics)
        if threshold is not None:
            metrics["num_masked_seqs_by_logprob_error"] = float(num_masked)
        return StepResult(
            metrics,
            valid_samples=int(train_data["sample_mask"].sum()),
            logs={"async": rollouts.extra_metrics} if rollouts.extra_metrics else {},
            samples=sample_rows(samples, sample_rewards, sample_advantages, c.tokenizer, train_data)[:num_samples],
            timing=rollouts.timing,
            kept=("loss", "reward"),
            extra={"rollouts": rollouts, "train_data": train_data, "train_results": train_results},
        )

    def sync_weights(self, step: int, timer: Timer) -> None:
        # 8. the engines get the new weights: sync GRPO before they next sample, async GRPO now
        self.source.after_training(step, timer)

    def validate(self, step: int, timer: Timer) -> None:
        self.source.validate(step, timer, partial(log_validation, self.c, step))

    def after_step(self, step: int, result: StepResult) -> None:
        rollouts, train_data = result.extra["rollouts"], result.extra["train_data"]
        # collapse monitors on this step's metrics and validation (docs/monitors.md); their history is checkpointed
        monitor_metrics = self.monitors.update(step, result.metrics, rollouts.rewards, self.state.val_metrics)
        self.state.monitors = self.monitors.state_dict()
        result.logs["monitor"] = monitor_metrics
        # a repro bundle (docs/debugging.md) when the step went non-finite, a monitor fired or grpo.dump_steps
        # asks; before this step's save, which may prune the checkpoint the bundle links
        self.repro.after_step(
            step, train_data, rollouts.rewards, result.extra["train_results"], result.metrics, monitor_metrics
        )
        result.save = result.save or self.repro.wants_checkpoint(step)

    def save(self) -> Path | None:
        return save_checkpoint(self.c, self.source.position)

    def log_step(self, step: int, result: StepResult, timing: dict[str, float]) -> None:
        # how the step went (its time includes the save)
        rollouts, train_results = result.extra["rollouts"], result.extra["train_results"]
        performance = {**step_performance(result.metrics, timing), **rollouts.generation_performance}
        if "profile" in train_results:
            profile = profile_metrics(train_results["profile"], timing["policy_training"])
            timing.update(profile["timing"])
            performance.update(profile["performance"])
        self.logger.log_metrics(memory_metrics(performance), step, prefix="memory")
        self.logger.log_metrics(performance, step, prefix="performance")
        self.logger.log_metrics(timing, step, prefix="timing/train")

    def close(self) -> None:
        self.source.close()


def policy_passes(c: GRPOComponents, step: int, timer: Timer, train_data: Any) -> tuple[dict[str, Any], int]:
    """GRPO's logprob passes and training; afterwards ``train_data`` holds ``prev_logprobs`` and
    ``reference_policy_logprobs`` where they were computed. Returns the training result and how many rows the
    logprob mismatch masked (``grpo.seq_logprob_error_threshold``)."""
    cfg = c.config
    num_masked = 0
    rows = step_rows(c.policy, train_data, step)
    try:
        phase(step, "logprobs")
        with timer.time("policy_and_reference_logprobs"):
            c.policy.prepare_for_lp_inference()
            threshold = cfg.grpo.seq_logprob_error_threshold
            if cfg.needs_prev_logprobs:
                rows.prev_logprobs()
            if threshold is not None:
                rows.read_prev_logprobs()
                num_masked = mask_logprob_mismatch(train_data, threshold)
                rows.sample_mask_changed()
            if cfg.needs_reference_model:
                rows.reference_logprobs()
        phase(step, "training")
        with timer.time("policy_training"):
            c.policy.prepare_for_training()
            train_results = rows.train(c.loss_fn)
            c.policy.finish_training()
    finally:
        rows.close()
    return train_results, num_masked


class GRPO(RolloutAlgorithm):
    name = "grpo"
    config_class = GRPOMasterConfig

    def setup(self, config: GRPOMasterConfig) -> GRPOComponents:
        return setup(config)

    def train(self, run: GRPOComponents) -> None:
        grpo_train(run)


ALGORITHM = GRPO()
