"""The one training loop of SFT, DPO and reward-model training: batch → prepare → train → validate → checkpoint → log.

An algorithm (`sft.py`, `dpo.py`, `rm.py`) is a `SupervisedAlgorithm` (`supervised.config`): its loss function, the
batch rows one example fills, a `prepare_batch` hook (DPO adds the reference policy's logprobs) and its metric names.
`supervised.setup.build_supervised_run` builds the `SupervisedRun` that `supervised_train` runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nemo_rl_clone.algorithms.run.state import format_metrics, run_validation, save_run_checkpoint, validates_at_end
from nemo_rl_clone.algorithms.run.stop import stop_on_signals
from nemo_rl_clone.algorithms.supervised.config import SupervisedAlgorithm
from nemo_rl_clone.algorithms.supervised.setup import SupervisedRun
from nemo_rl_clone.algorithms.utils import combine_batches, reduce_train_results
from nemo_rl_clone.models.policy.train_profile import memory_metrics, profile_metrics
from nemo_rl_clone.utils.checkpoint import SaveDeadline, should_save
from nemo_rl_clone.utils.progress import StepProgress, advance, console, phase
from nemo_rl_clone.utils.timer import Timer

# Printed after each step and validation.
SHOWN_METRICS = ("loss", "val_loss", "accuracy", "reward_margin", "grad_norm")


def step_metrics(algorithm: SupervisedAlgorithm, train_results: Mapping[str, Any]) -> dict[str, float]:
    """One ``policy.train`` call's metrics: shares summed over microbatches, counts summed, grad norm, lr."""
    return reduce_train_results(train_results, algorithm.share_metrics, algorithm.count_metrics)


def validate(run: SupervisedRun) -> dict[str, float]:
    """Eval-mode forward passes (no optimizer step) over the validation batches; {} without validation data."""
    if not run.val_batches:
        return {}
    algorithm, loop, rows = run.algorithm, run.loop, run.algorithm.rows_per_example
    if run.prepared_val_batches is None:  # fixed batches and a frozen reference: prepare them once
        run.prepared_val_batches = [
            algorithm.prepare_batch(batch, run.policy, rows * loop.val_micro_batch_size) for batch in run.val_batches
        ]
    per_batch = []
    for batch in run.prepared_val_batches:
        results = run.policy.train(
            batch,
            algorithm.loss_fn,
            eval_mode=True,
            gbs=rows * loop.val_global_batch_size,
            mbs=rows * loop.val_micro_batch_size,
        )
        per_batch.append(step_metrics(algorithm, results))
    return algorithm.validation_metrics(combine_batches(per_batch, algorithm.share_metrics, algorithm.count_metrics))


def log_validation(run: SupervisedRun, step: int) -> dict[str, float]:
    phase(step, "validation")
    return run_validation(lambda: validate(run), run.state, run.logger, step, SHOWN_METRICS)


def supervised_train(run: SupervisedRun) -> None:
    """Train until ``max_num_steps``, ``max_num_epochs`` or ``checkpointing.checkpoint_must_save_by``."""
    total_steps = int(min(run.loop.step_limit, run.loop.max_num_epochs * run.dataloader.batches_per_epoch))
    with (
        StepProgress(run.algorithm.section.upper(), total_steps, start_step=run.state.step),
        stop_on_signals(
            run.checkpointer,
            run.state,
            run.dataloader,
            lambda: _save(run),
            run.config.checkpointing.sigterm_grace_period_s,
        ),
    ):
        _run_steps(run, total_steps)


def _save(run: SupervisedRun) -> Path | None:
    return save_run_checkpoint(
        run.checkpointer,
        run.policy,
        run.dataloader,
        run.state,
        run.config,
    )


def _run_steps(run: SupervisedRun, total_steps: int) -> None:
    loop, state, algorithm, policy = run.loop, run.state, run.algorithm, run.policy
    checkpointing = run.config.checkpointing
    rows = algorithm.rows_per_example
    train_gbs, train_mbs = run.config.policy.train_global_batch_size, run.config.policy.train_micro_batch_size
    timer, deadline = Timer(), SaveDeadline(checkpointing)
    policy.prepare_for_training()  # nothing else shares the devices: the weights stay put from here on
    if loop.val_at_start and state.step == 0:
        log_validation(run, step=0)
    batches = iter(run.dataloader)
    while state.step < loop.step_limit and run.dataloader.completed_epochs < loop.max_num_epochs:
        timer.reset()
        step = state.step + 1
        state.val_metrics = {}  # a checkpoint carries the validation metrics of its own step only (keep_top_k)
        with timer.time("total_step_time"):
            phase(step, "training")
            with timer.time("data_processing"):
                batch = algorithm.prepare_batch(next(batches), policy, rows * train_mbs)
            with timer.time("policy_training"):
                results = policy.train(batch, algorithm.loss_fn, gbs=rows * train_gbs, mbs=rows * train_mbs)
            metrics = algorithm.train_metrics(step_metrics(algorithm, results))
            state.step = step
            state.total_valid_samples += int(metrics.get("num_valid_samples", 0))
            state.train_metrics = metrics

            if loop.val_period > 0 and step % loop.val_period == 0:
                with timer.time("validation"):
                    log_validation(run, step)

            deadline.mark_step()
            stop_for_deadline = deadline.reached()
            is_last = (
                step >= loop.step_limit or run.dataloader.completed_epochs >= loop.max_num_epochs or stop_for_deadline
            )
            # logged before the save: a run killed right after it resumes after this step (docs/grpo.md)
            run.logger.log_metrics(metrics, step, prefix="train")
            if should_save(step, checkpointing, is_last):
                phase(step, "checkpoint")
                with timer.time("checkpointing"):
                    _save(run)

        timing = timer.get_timing_metrics("sum")
        if "profile" in results:
            profile = profile_metrics(results["profile"], timing["policy_training"])
            timing.update(profile["timing"])
            run.logger.log_metrics(memory_metrics(profile["performance"]), step, prefix="memory")
            run.logger.log_metrics(profile["performance"], step, prefix="performance")
        run.logger.log_metrics(timing, step, prefix="timing/train")
        console.print(f"step {step}/{total_steps}: " + format_metrics(metrics, SHOWN_METRICS))
        advance(step)
        if stop_for_deadline:
            console.print(f"[yellow]checkpointing.checkpoint_must_save_by reached: saved and stopping at step {step}")
            break
    if validates_at_end(loop.val_at_end, loop.val_period, state.step):
        log_validation(run, state.step)
    console.print(f"Done after step {state.step}. Logs: {run.log_dir}  Checkpoints: {checkpointing.checkpoint_dir}")
