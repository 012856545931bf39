"""GRPO: generate → reward → advantages → logprobs → train → sync → validate → checkpoint → log (see docs/grpo.md).

`grpo_train` is the whole step loop and reads top to bottom; building the run lives in `grpo_setup`, the reward
arithmetic in `algorithms.utils`, batch plumbing in `grpo_batches`.
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_rl_clone.algorithms.grpo_batches import (
    aggregate_train_metrics,
    build_train_batch,
    combine_rollout_metrics,
    generation_seeds,
    print_samples,
    process_rewards,
    sample_rows,
    select_groups,
)
from nemo_rl_clone.algorithms.grpo_setup import GRPOComponents, save_checkpoint
from nemo_rl_clone.algorithms.refit import refit_policy_generation
from nemo_rl_clone.algorithms.run_state import run_validation
from nemo_rl_clone.algorithms.run_stop import stop_on_signals
from nemo_rl_clone.algorithms.utils import compute_advantages, groups_with_signal
from nemo_rl_clone.data.collate_fn import rl_collate_fn
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.experience.rollouts import run_multi_turn_rollout
from nemo_rl_clone.models.policy.train_profile import profile_metrics
from nemo_rl_clone.utils.checkpoint import SaveDeadline, should_save
from nemo_rl_clone.utils.progress import StepProgress, advance, console, phase
from nemo_rl_clone.utils.timer import Timer


def grpo_train(c: GRPOComponents) -> None:
    """Run GRPO steps until ``grpo.max_num_steps``, ``grpo.max_num_epochs`` or the save deadline."""
    with (
        StepProgress("GRPO", c.config.grpo.max_num_steps, start_step=c.state.step),
        stop_on_signals(
            c.checkpointer,
            c.state,
            c.dataloader,
            lambda: save_checkpoint(c),
            c.config.checkpointing.sigterm_grace_period_s,
        ),
    ):
        _run_steps(c)


def _run_steps(c: GRPOComponents) -> None:
    cfg, state, timer = c.config, c.state, Timer()
    group_size = cfg.grpo.num_generations_per_prompt
    deadline = SaveDeadline(cfg.checkpointing)
    weights_stale = state.step > 0  # a resumed policy differs from the model the engines loaded
    if cfg.grpo.val_at_start and state.step == 0 and cfg.grpo.val_period > 0:
        log_validation(c, step=0)
    batches = iter(c.dataloader)
    while state.step < cfg.grpo.max_num_steps and c.dataloader.completed_epochs < cfg.grpo.max_num_epochs:
        timer.reset()
        step = state.begin_step()
        with timer.time("total_step_time"):
            # 1-3. prompts × generations, fresh weights in the engines, rollouts (repeated while dynamic sampling
            # still lacks groups with reward variance).
            if weights_stale:
                phase(step, "weight sync")
                _refit(c, timer)
                weights_stale = False
            phase(step, "generation")
            rollouts, rewards, per_batch_metrics = [], [], []
            for gen_batch in range(cfg.grpo.dynamic_sampling_max_gen_batches if cfg.grpo.use_dynamic_sampling else 1):
                prompts = next(batches).repeat_interleave(group_size)
                prompts["seeds"] = generation_seeds(cfg.grpo.seed, step, gen_batch, prompts.size)
                with timer.time("generation"):
                    c.generation.prepare_for_generation()
                    batch, batch_metrics = run_multi_turn_rollout(
                        c.generation,
                        prompts,
                        c.tokenizer,
                        c.task_to_env,
                        max_seq_len=cfg.policy.max_total_sequence_length,
                        max_rollout_turns=cfg.grpo.max_rollout_turns,
                    )
                    c.generation.finish_generation()
                # 4. reward shaping and scaling
                batch_rewards = process_rewards(batch, cfg.grpo)
                rollouts.append(batch)
                rewards.append(batch_rewards)
                per_batch_metrics.append(batch_metrics)
                if not cfg.grpo.use_dynamic_sampling:
                    break
                if int(groups_with_signal(torch.cat(rewards), group_size).sum()) >= cfg.grpo.num_prompts_per_step:
                    break
            generation_performance = c.generation.take_performance_metrics()
            rollout_metrics = combine_rollout_metrics(per_batch_metrics, [b.size for b in rollouts])
            batch = BatchedDataDict.from_batches(rollouts) if len(rollouts) > 1 else rollouts[0]
            raw_rewards = torch.cat(rewards)
            sampling_metrics: dict[str, float] = {}
            if cfg.grpo.use_dynamic_sampling:
                surplus = int(groups_with_signal(raw_rewards, group_size).sum()) - cfg.grpo.num_prompts_per_step
                sampling_metrics = {
                    "dynamic_sampling_num_gen_batches": float(len(rollouts)),
                    "dynamic_sampling_num_discarded_valid_samples": float(max(0, surplus) * group_size),
                }
                batch, raw_rewards = select_groups(batch, raw_rewards, group_size, cfg.grpo.num_prompts_per_step)

            # 5. advantages: leave-one-out baseline, normalised by the group std
            advantages = compute_advantages(
                raw_rewards, group_size, cfg.grpo.use_leave_one_out_baseline, cfg.grpo.normalize_rewards
            )
            train_data = build_train_batch(batch, advantages, c.tokenizer, cfg)

            # 6. logprobs of the pre-update policy (unless the loss takes them on-policy from the training forward)
            # and of the reference policy (when the KL term is on)
            phase(step, "logprobs")
            with timer.time("policy_and_reference_logprobs"):
                c.policy.prepare_for_lp_inference()
                if not cfg.loss_fn.force_on_policy_ratio:
                    train_data["prev_logprobs"] = c.policy.get_logprobs(train_data)["logprobs"]
                if cfg.loss_fn.reference_policy_kl_penalty > 0:
                    reference = c.policy.get_reference_policy_logprobs(train_data)["reference_logprobs"]
                    train_data["reference_policy_logprobs"] = reference

            # 7. train
            phase(step, "training")
            with timer.time("policy_training"):
                c.policy.prepare_for_training()
                train_results = c.policy.train(train_data, c.loss_fn)
                c.policy.finish_training()
            weights_stale = True
            state.step = step
            state.total_valid_samples += int(train_data["sample_mask"].sum())

            # 8. validation (on fresh weights)
            if cfg.grpo.val_period > 0 and step % cfg.grpo.val_period == 0:
                _refit(c, timer)
                weights_stale = False
                log_validation(c, step)

            # 9. checkpoint
            deadline.mark_step()
            stop_for_deadline = deadline.reached()
            is_last = (
                step >= cfg.grpo.max_num_steps
                or c.dataloader.completed_epochs >= cfg.grpo.max_num_epochs
                or stop_for_deadline
            )
            metrics = aggregate_train_metrics(train_results, train_data, raw_rewards, advantages, rollout_metrics)
            metrics.update(sampling_metrics)
            state.train_metrics = {"loss": metrics["loss"], "reward": metrics["reward"]}
            if should_save(step, cfg.checkpointing, is_last):
                phase(step, "checkpoint")
                with timer.time("checkpointing"):
                    path = save_checkpoint(c)
                console.print(f"[green]step {step}: saved checkpoint {path}")

        # 10. log
        timing = timer.get_timing_metrics("sum")
        performance = {**_performance(metrics, timing), **generation_performance}
        if "profile" in train_results:
            profile = profile_metrics(train_results["profile"], timing["policy_training"])
            timing.update(profile["timing"])
            performance.update(profile["performance"])
        c.logger.log_metrics(metrics, step, prefix="train")
        c.logger.log_metrics(performance, step, prefix="performance")
        c.logger.log_metrics(timing, step, prefix="timing/train")
        c.logger.log_samples_jsonl(sample_rows(batch, raw_rewards, advantages), step)
        advance(step)
        if stop_for_deadline:
            console.print(f"[yellow]checkpointing.checkpoint_must_save_by reached: saved and stopping at step {step}")
            break
    console.print(f"Done after step {state.step}. Logs: {c.log_dir}  Checkpoints: {cfg.checkpointing.checkpoint_dir}")


def validate(c: GRPOComponents, samples: list[dict[str, Any]] | None = None) -> dict[str, float]:
    """Roll out the validation prompts once (sampled with fixed per-prompt seeds, so runs compare fairly).

    Returns ``accuracy`` (fraction of responses with reward 1) and ``avg_length`` (generated tokens). ``samples``
    receives the first ``logger.num_val_samples_to_print`` samples as `sample_rows` rows.
    """
    cfg = c.config
    if c.val_dataset is None:
        return {}
    count = min(len(c.val_dataset), cfg.grpo.max_val_samples)
    rewards, lengths = [], []
    for start in range(0, count, cfg.grpo.val_batch_size):
        prompts = rl_collate_fn([c.val_dataset[i] for i in range(start, min(count, start + cfg.grpo.val_batch_size))])
        prompts["seeds"] = [cfg.grpo.seed * 100_003 + start + i for i in range(prompts.size)]
        c.generation.prepare_for_generation()
        batch, metrics = run_multi_turn_rollout(
            c.generation,
            prompts,
            c.tokenizer,
            c.task_to_env,
            max_seq_len=cfg.policy.max_total_sequence_length,
            max_rollout_turns=cfg.grpo.max_rollout_turns,
        )
        c.generation.finish_generation()
        if samples is not None and len(samples) < cfg.logger.num_val_samples_to_print:
            rows = sample_rows(batch, batch["total_reward"])
            samples.extend(rows[: cfg.logger.num_val_samples_to_print - len(samples)])
        rewards.append(batch["total_reward"])
        lengths.append(metrics["mean_generation_length"] * batch.size)
    all_rewards = torch.cat(rewards)
    c.generation.take_performance_metrics()  # validation's generation is not the next training step's
    return {"accuracy": (all_rewards == 1.0).float().mean().item(), "avg_length": sum(lengths) / count}


def log_validation(c: GRPOComponents, step: int) -> None:
    phase(step, "validation")
    samples: list[dict[str, Any]] = []
    run_validation(lambda: validate(c, samples), c.state, c.logger, step, shown=("accuracy", "avg_length"))
    print_samples(samples, f"step {step}: validation sample")


def _refit(c: GRPOComponents, timer: Timer) -> None:
    buffer_gb = c.config.policy.refit_buffer_size_gb
    bucket = {"bucket_bytes": int(buffer_gb * 2**30)} if buffer_gb else {}
    refit_policy_generation(c.policy, c.generation, c.colocated, timer=timer, **bucket)


def _performance(metrics: dict[str, float], timing: dict[str, float]) -> dict[str, float]:
    total_tokens = metrics["total_num_tokens"]
    return {
        "tokens_per_sec": total_tokens / max(timing["total_step_time"], 1e-9),
        "generation_tokens_per_sec": metrics["generated_tokens"] / max(timing["generation"], 1e-9),
        "policy_training_tokens_per_sec": total_tokens / max(timing["policy_training"], 1e-9),
    }
