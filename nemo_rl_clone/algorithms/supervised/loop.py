"""The one training loop of SFT, DPO and reward-model training: batch → prepare → train → validate → checkpoint → log.

An algorithm (`sft/`, `dpo/`, `rm/`) is a `SupervisedAlgorithm` (`supervised.config`): its loss function, the
batch rows one example fills, a `prepare_batch` hook (DPO adds the reference policy's logprobs) and its metric names.
`supervised.setup.build_supervised_run` builds the `SupervisedRun` that `supervised_train` runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from nemo_rl_clone.algorithms.run.loop import Schedule, StepResult, train_loop
from nemo_rl_clone.algorithms.run.state import format_metrics, run_validation, save_run_checkpoint
from nemo_rl_clone.algorithms.supervised.config import SupervisedAlgorithm
from nemo_rl_clone.algorithms.supervised.setup import SupervisedRun
from nemo_rl_clone.algorithms.utils import combine_batches, reduce_train_results
from nemo_rl_clone.models.policy.workers.train_profile import memory_metrics, profile_metrics
from nemo_rl_clone.utils.progress import console, phase
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
    """Train until ``max_num_steps``, ``max_num_epochs`` or ``checkpointing.checkpoint_must_save_by``
    (`run.loop.train_loop`)."""
    train_loop(SupervisedSteps(run))


class SupervisedSteps:
    """SFT's, DPO's and RM's step for `train_loop`: prepare the batch (DPO: reference logprobs), train."""

    def __init__(self, run: SupervisedRun) -> None:
        loop = run.loop
        self.run, self.algorithm, self.policy = run, run.algorithm, run.policy
        self.state, self.logger, self.checkpointer, self.log_dir = run.state, run.logger, run.checkpointer, run.log_dir
        self.checkpointing, self.watchdog = run.config.checkpointing, run.config.watchdog
        total = int(min(loop.step_limit, loop.max_num_epochs * run.dataloader.batches_per_epoch))
        self.schedule = Schedule(
            run.algorithm.section.upper(),
            loop.step_limit,
            loop.max_num_epochs,
            loop.val_period,
            val_at_start=loop.val_at_start,
            val_at_end=loop.val_at_end,
            total_steps=total,
        )
        self.total_steps = total
        self.rows = run.algorithm.rows_per_example
        self.batches: Iterator[Any] | None = None

    @property
    def position(self) -> Any:
        return self.run.dataloader

    def start(self, timer: Timer) -> None:
        self.policy.prepare_for_training()  # nothing else shares the devices: the weights stay put from here on

    def train_step(self, step: int, timer: Timer) -> StepResult | None:
        if self.batches is None:  # after validation at start, which must not move the loader
            self.batches = iter(self.run.dataloader)
        policy, algorithm, config = self.policy, self.algorithm, self.run.config
        gbs, mbs = self.rows * config.policy.train_global_batch_size, self.rows * config.policy.train_micro_batch_size
        phase(step, "training")
        with timer.time("data_processing"):
            batch = algorithm.prepare_batch(next(self.batches), policy, mbs)
        with timer.time("policy_training"):
            results = policy.train(batch, algorithm.loss_fn, gbs=gbs, mbs=mbs)
        metrics = algorithm.train_metrics(step_metrics(algorithm, results))
        return StepResult(metrics, valid_samples=int(metrics.get("num_valid_samples", 0)), extra={"results": results})

    def sync_weights(self, step: int, timer: Timer) -> None:
        pass  # no generation engines

    def validate(self, step: int, timer: Timer) -> None:
        with timer.time("validation"):
            log_validation(self.run, step)

    def after_step(self, step: int, result: StepResult) -> None:
        pass

    def save(self) -> Path | None:
        run = self.run
        return save_run_checkpoint(run.checkpointer, run.policy, run.dataloader, run.state, run.config)

    def log_step(self, step: int, result: StepResult, timing: dict[str, float]) -> None:
        results = result.extra["results"]
        if "profile" in results:
            profile = profile_metrics(results["profile"], timing["policy_training"])
            timing.update(profile["timing"])
            self.logger.log_metrics(memory_metrics(profile["performance"]), step, prefix="memory")
            self.logger.log_metrics(profile["performance"], step, prefix="performance")
        self.logger.log_metrics(timing, step, prefix="timing/train")
        console.print(f"step {step}/{self.total_steps}: " + format_metrics(result.metrics, SHOWN_METRICS))

    def close(self) -> None:
        pass
