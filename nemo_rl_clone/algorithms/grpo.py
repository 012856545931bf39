"""GRPO: generate → reward → advantages → logprobs → train → sync → validate → checkpoint → log (see docs/grpo.md).

`grpo_train` is the whole step loop and reads top to bottom; building the run lives in `rl.setup`, where
rollouts come from (on demand, or from async GRPO's replay buffer) in `rl.rollouts` / `rl.async_rollouts`, the
reward arithmetic in `algorithms.utils`, batch plumbing in `rl.batches`, the collapse monitors in `rl.monitors`, repro
bundles in `rl.repro`.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import psutil
import torch

from nemo_rl_clone.algorithms.rl.async_rollouts import AsyncRollouts
from nemo_rl_clone.algorithms.rl.batches import (
    aggregate_train_metrics,
    build_train_batch,
    mask_logprob_mismatch,
    print_samples,
    sample_rows,
    step_advantages,
)
from nemo_rl_clone.algorithms.rl.config import GRPOConfig, GRPOMasterConfig
from nemo_rl_clone.algorithms.rl.monitors import CollapseMonitors
from nemo_rl_clone.algorithms.rl.repro import ReproBundles
from nemo_rl_clone.algorithms.rl.rollouts import RolloutSource, SyncRollouts, roll_out
from nemo_rl_clone.algorithms.rl.setup import GRPOComponents, GRPOState, save_checkpoint, setup
from nemo_rl_clone.algorithms.run.state import run_validation, validates_at_end
from nemo_rl_clone.algorithms.run.stop import stop_on_signals
from nemo_rl_clone.data.collate_fn import rl_collate_fn
from nemo_rl_clone.models.policy.train_profile import memory_metrics, profile_metrics
from nemo_rl_clone.utils.checkpoint import SaveDeadline, should_save
from nemo_rl_clone.utils.progress import StepProgress, advance, console, phase
from nemo_rl_clone.utils.timer import Timer

# NeMo-RL's names: `from nemo_rl_clone.algorithms.grpo import MasterConfig, setup, grpo_train`.
MasterConfig = GRPOMasterConfig
GRPOSaveState = GRPOState
__all__ = ["GRPOConfig", "GRPOSaveState", "MasterConfig", "grpo_train", "setup", "validate"]


def grpo_train(c: GRPOComponents) -> None:
    """Run GRPO steps until ``grpo.max_num_steps``, ``grpo.max_num_epochs``, the end of the collector's data or the
    save deadline. Rollouts come from `SyncRollouts`, or `AsyncRollouts` with ``grpo.async_grpo.enabled``."""
    source: RolloutSource = AsyncRollouts(c) if c.config.grpo.async_grpo.enabled else SyncRollouts(c)
    try:
        with (
            StepProgress("GRPO", c.config.grpo.max_num_steps, start_step=c.state.step),
            stop_on_signals(
                c.checkpointer,
                c.state,
                source.position,
                lambda: save_checkpoint(c, source.position),
                c.config.checkpointing.sigterm_grace_period_s,
            ),
        ):
            _run_steps(c, source)
    finally:
        source.close()


def _run_steps(c: GRPOComponents, source: RolloutSource) -> None:
    cfg, state, timer = c.config, c.state, Timer()
    deadline = SaveDeadline(cfg.checkpointing)
    monitors = CollapseMonitors(cfg.monitors, cfg.grpo.num_generations_per_prompt, state.monitors)
    repro = ReproBundles(c, monitors.alerting)
    if cfg.grpo.val_at_start and state.step == 0 and cfg.grpo.val_period > 0:
        source.validate(0, timer, partial(log_validation, c, 0))
    # process start to the first step this process runs (imports, Ray, engines, policy, data, validation at start)
    startup_time: float | None = time.time() - psutil.Process().create_time()
    while state.step < cfg.grpo.max_num_steps and source.position.completed_epochs < cfg.grpo.max_num_epochs:
        timer.reset()
        step = state.begin_step()
        with timer.time("total_step_time"):
            # 1-4. prompts × generations with fresh (sync) or recent enough (async) weights, rollouts, rewards
            rollouts = source.next(step, timer)
            if rollouts is None:
                console.print(f"[yellow]step {step}: the trajectory collector has no more data; stopping")
                break
            batch, rewards = rollouts.batch, rollouts.rewards

            # 5. advantages: leave-one-out baseline, normalised by the group std, optionally clipped
            advantages = step_advantages(rewards, cfg.grpo, batch)
            train_data = build_train_batch(batch, advantages, c.tokenizer, cfg)

            # 6. logprobs of the pre-update policy (unless the loss takes them on-policy from the training forward)
            # and of the reference policy (when the KL term is on)
            phase(step, "logprobs")
            with timer.time("policy_and_reference_logprobs"):
                c.policy.prepare_for_lp_inference()
                threshold = cfg.grpo.seq_logprob_error_threshold
                if not cfg.loss_fn.force_on_policy_ratio or threshold is not None:
                    train_data["prev_logprobs"] = c.policy.get_logprobs(train_data)["logprobs"]
                if threshold is not None:
                    num_masked = mask_logprob_mismatch(train_data, threshold)
                if (
                    cfg.loss_fn.reference_policy_kl_penalty > 0
                    and not cfg.grpo.skip_reference_policy_logprobs_calculation
                ):
                    reference = c.policy.get_reference_policy_logprobs(train_data)["reference_logprobs"]
                    train_data["reference_policy_logprobs"] = reference

            # 7. train, then hand the engines the new weights (sync: before the next generation; async: now)
            phase(step, "training")
            with timer.time("policy_training"):
                c.policy.prepare_for_training()
                train_results = c.policy.train(train_data, c.loss_fn)
                c.policy.finish_training()
            state.step = step
            state.total_valid_samples += int(train_data["sample_mask"].sum())
            source.after_training(step, timer)

            # 8. validation (on fresh weights)
            if cfg.grpo.val_period > 0 and step % cfg.grpo.val_period == 0:
                source.validate(step, timer, partial(log_validation, c, step))

            # 9. checkpoint
            deadline.mark_step()
            stop_for_deadline = deadline.reached()
            is_last = (
                step >= cfg.grpo.max_num_steps
                or source.position.completed_epochs >= cfg.grpo.max_num_epochs
                or stop_for_deadline
            )
            metrics = aggregate_train_metrics(
                train_results, train_data, rewards, advantages, rollouts.rollout_metrics, batch["total_reward"]
            )
            metrics.update(rollouts.sampling_metrics)
            if cfg.grpo.seq_logprob_error_threshold is not None:
                metrics["num_masked_seqs_by_logprob_error"] = float(num_masked)
            state.train_metrics = {"loss": metrics["loss"], "reward": metrics["reward"]}
            # collapse monitors on this step's metrics and validation (docs/monitors.md); their history is checkpointed
            monitor_metrics = monitors.update(step, metrics, rewards, state.val_metrics)
            state.monitors = monitors.state_dict()
            # a repro bundle (docs/debugging.md) when the step went non-finite, a monitor fired or grpo.dump_steps
            # asks; before this step's save, which may prune the checkpoint the bundle links
            repro.after_step(step, train_data, rewards, train_results, metrics, monitor_metrics)
            # the step's results are logged before its save: a run killed right after the save resumes after this
            # step, so they would be lost; killed before it, the resumed run redoes and logs the step again
            c.logger.log_metrics(metrics, step, prefix="train")
            if rollouts.extra_metrics:
                c.logger.log_metrics(rollouts.extra_metrics, step, prefix="async")
            c.logger.log_metrics(monitor_metrics, step, prefix="monitor")
            c.logger.log_samples_jsonl(sample_rows(batch, rewards, advantages, c.tokenizer, train_data), step)
            if should_save(step, cfg.checkpointing, is_last) or repro.wants_checkpoint(step):
                phase(step, "checkpoint")
                with timer.time("checkpointing"):
                    save_checkpoint(c, source.position)

        # 10. log how the step went (its time includes the save)
        timing = {**rollouts.timing, **timer.get_timing_metrics("sum")}
        if startup_time is not None:
            timing["startup_time"], startup_time = startup_time, None
        performance = {**_performance(metrics, timing), **rollouts.generation_performance}
        if "profile" in train_results:
            profile = profile_metrics(train_results["profile"], timing["policy_training"])
            timing.update(profile["timing"])
            performance.update(profile["performance"])
        c.logger.log_metrics(memory_metrics(performance), step, prefix="memory")
        c.logger.log_metrics(performance, step, prefix="performance")
        c.logger.log_metrics(timing, step, prefix="timing/train")
        advance(step)
        if stop_for_deadline:
            console.print(f"[yellow]checkpointing.checkpoint_must_save_by reached: saved and stopping at step {step}")
            break
    if validates_at_end(cfg.grpo.val_at_end, cfg.grpo.val_period, state.step):
        source.validate(state.step, timer, partial(log_validation, c, state.step))
    console.print(f"Done after step {state.step}. Logs: {c.log_dir}  Checkpoints: {cfg.checkpointing.checkpoint_dir}")


def validate(c: GRPOComponents, samples: list[dict[str, Any]] | None = None) -> dict[str, float]:
    """Roll out the validation prompts once (sampled with fixed per-prompt seeds, so runs compare fairly).

    Returns ``accuracy`` (fraction of responses with reward 1), ``mean_reward`` (what a graded scorer such as a
    reward model is judged by) and ``avg_length`` (generated tokens). ``samples``
    receives the first ``logger.num_val_samples_to_print`` samples as `sample_rows` rows.
    """
    cfg = c.config
    if c.val_dataset is None:
        return {}
    count = min(len(c.val_dataset), cfg.grpo.max_val_samples or len(c.val_dataset))
    batch_size = cfg.grpo.val_batch_size or count
    rewards, lengths = [], []
    for start in range(0, count, batch_size):
        prompts = rl_collate_fn([c.val_dataset[i] for i in range(start, min(count, start + batch_size))])
        prompts["seeds"] = [cfg.grpo.seed * 100_003 + start + i for i in range(prompts.size)]
        batch, metrics = roll_out(c, prompts)
        if samples is not None and len(samples) < cfg.logger.num_val_samples_to_print:
            rows = sample_rows(batch, batch["total_reward"])
            samples.extend(rows[: cfg.logger.num_val_samples_to_print - len(samples)])
        rewards.append(batch["total_reward"])
        lengths.append(metrics["mean_generation_length"] * batch.size)
    all_rewards = torch.cat(rewards)
    c.generation.take_performance_metrics()  # validation's generation is not the next training step's
    return {
        "accuracy": (all_rewards == 1.0).float().mean().item(),
        "mean_reward": all_rewards.float().mean().item(),
        "avg_length": sum(lengths) / count,
    }


def log_validation(c: GRPOComponents, step: int) -> None:
    phase(step, "validation")
    samples: list[dict[str, Any]] = []
    run_validation(lambda: validate(c, samples), c.state, c.logger, step, shown=("accuracy", "avg_length"))
    print_samples(samples, f"step {step}: validation sample")


def _performance(metrics: dict[str, float], timing: dict[str, float]) -> dict[str, float]:
    total_tokens = metrics["total_num_tokens"]
    return {
        "tokens_per_sec": total_tokens / max(timing["total_step_time"], 1e-9),
        "generation_tokens_per_sec": metrics["generated_tokens"] / max(timing["generation"], 1e-9),
        "policy_training_tokens_per_sec": total_tokens / max(timing["policy_training"], 1e-9),
    }
