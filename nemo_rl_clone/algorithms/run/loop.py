"""The one training loop every algorithm runs: an algorithm supplies its step, the loop owns the rest.

    train_loop(steps)        # steps: a `StepAlgorithm` (GRPO, distillation, SFT / DPO / RM, ...)

Per step, in this order:

    train_step(step)   generate → reward → advantages → logprobs → train (whatever the algorithm's step is)
    sync_weights(step) after training: hand the generation engines the new weights (now, or before they next sample)
    validate(step)     every ``val_period`` steps, and after the last one with ``val_at_end``
    after_step(step)   the algorithm's bookkeeping on the step's metrics (GRPO: collapse monitors, repro bundles)
    log                ``train/*`` and the step's other metric groups and samples, *before* the save
    save               on the checkpoint schedule, on the last step, or when the step asks for one
    log_step(step)     timing and throughput, which include the save

The loop also owns what every algorithm shares: the progress bar, Ctrl-C / SIGTERM / worker deaths / failed saves
(`stop.stop_on_signals`), ``checkpointing.checkpoint_must_save_by`` (`SaveDeadline`: stop one step early rather
than one late), validation at the start, and the closing line. A step's results are logged before its save: a run
killed right after the save resumes after this step, so they would otherwise be lost; killed before it, the resumed
run redoes the step and logs it again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import psutil

from nemo_rl_clone.algorithms.run.stop import LoaderPosition, stop_on_signals
from nemo_rl_clone.utils.checkpoint_schedule import SaveDeadline, should_save
from nemo_rl_clone.utils.progress import StepProgress, advance, console, phase
from nemo_rl_clone.utils.timer import Timer
from nemo_rl_clone.utils.watchdog import WatchdogConfig

if TYPE_CHECKING:
    from nemo_rl_clone.algorithms.run.state import RunState
    from nemo_rl_clone.utils.checkpoint import CheckpointingConfig, CheckpointManager
    from nemo_rl_clone.utils.logger import Logger


@dataclass(frozen=True)
class Schedule:
    """When a run stops and validates. ``max_num_steps`` may be ``math.inf`` (SFT's -1); ``total_steps`` is what the
    progress bar counts to (default ``max_num_steps``)."""

    title: str
    max_num_steps: float
    max_num_epochs: float
    val_period: int
    val_at_start: bool
    val_at_end: bool
    total_steps: int | None = None  # required when max_num_steps is infinite

    @classmethod
    def for_rollouts(cls, title: str, section: Any) -> Schedule:
        """From an RL loop section (``grpo``, ``distillation``, ``ppo``): NeMo-RL validates at the start only when
        it validates periodically (``val_period`` > 0)."""
        return cls(
            title,
            section.max_num_steps,
            section.max_num_epochs,
            section.val_period,
            val_at_start=section.val_at_start and section.val_period > 0,
            val_at_end=section.val_at_end,
        )

    def validates_after(self, step: int, is_last: bool) -> bool:
        return (self.val_period > 0 and step % self.val_period == 0) or (self.val_at_end and is_last)


@dataclass
class StepResult:
    """What one training step hands back to the loop.

    ``metrics`` are logged as ``train/*``; the checkpoint's train metrics (what ``checkpointing.metric_name: "train:*"``
    ranks by) are the ``kept`` ones, or all of them; ``logs`` are further metric groups logged with them
    (prefix → metrics); ``samples`` the step's rows for ``train_data_step{N}.jsonl``; ``timing`` times measured
    outside the loop's timer; ``save`` asks for a checkpoint of this step whatever the schedule.
    """

    metrics: dict[str, float]
    valid_samples: int = 0
    logs: dict[str, dict[str, float]] = field(default_factory=dict)
    samples: list[dict[str, Any]] | None = None
    timing: dict[str, float] = field(default_factory=dict)
    save: bool = False
    kept: tuple[str, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # the algorithm's own, for `after_step` / `log_step`


class StepAlgorithm(Protocol):
    """What `train_loop` asks of an algorithm (one object per run, built from the run's components). Optional: a
    ``watchdog`` attribute (`WatchdogConfig`, the run's ``watchdog`` section); without it the default bounds apply."""

    schedule: Schedule
    state: RunState
    logger: Logger
    checkpointer: CheckpointManager
    checkpointing: CheckpointingConfig
    log_dir: Path

    @property
    def position(self) -> LoaderPosition: ...
    def start(self, timer: Timer) -> None: ...
    def train_step(self, step: int, timer: Timer) -> StepResult | None: ...
    def sync_weights(self, step: int, timer: Timer) -> None: ...
    def validate(self, step: int, timer: Timer) -> None: ...
    def after_step(self, step: int, result: StepResult) -> None: ...
    def save(self) -> Path | None: ...
    def log_step(self, step: int, result: StepResult, timing: dict[str, float]) -> None: ...
    def close(self) -> None: ...


def train_loop(steps: StepAlgorithm) -> None:
    """Run ``steps`` until ``max_num_steps``, ``max_num_epochs``, the end of the data (``train_step`` returns None)
    or the save deadline; a signal, a dead worker or a failed save ends it as `stop.stop_on_signals` says."""
    schedule = steps.schedule
    total = int(schedule.max_num_steps) if schedule.total_steps is None else schedule.total_steps
    try:
        with (
            StepProgress(schedule.title, total, start_step=steps.state.step),
            stop_on_signals(
                steps.checkpointer,
                steps.state,
                steps.position,
                steps.save,
                steps.checkpointing.sigterm_grace_period_s,
                # ``watchdog`` is optional: a plug-in algorithm without one runs under the default bounds
                getattr(steps, "watchdog", None) or WatchdogConfig(),
                steps.log_dir,
            ),
        ):
            _run_steps(steps)
    finally:
        steps.close()


def _run_steps(steps: StepAlgorithm) -> None:
    schedule, state, timer = steps.schedule, steps.state, Timer()
    deadline = SaveDeadline(steps.checkpointing)
    steps.start(timer)
    if schedule.val_at_start and state.step == 0:
        steps.validate(0, timer)
    # process start to this process's first step (imports, Ray, workers, engines, validation at start): logged
    # with that step as timing/train/startup_time
    startup_time: float | None = time.time() - psutil.Process().create_time()
    while state.step < schedule.max_num_steps and steps.position.completed_epochs < schedule.max_num_epochs:
        timer.reset()
        step = state.begin_step()
        with timer.time("total_step_time"):
            result = steps.train_step(step, timer)
            if result is None:
                console.print(f"[yellow]step {step}: no more training data; stopping")
                break
            state.step = step
            state.total_valid_samples += result.valid_samples
            steps.sync_weights(step, timer)

            deadline.mark_step()
            stop_for_deadline = deadline.reached()
            is_last = (
                step >= schedule.max_num_steps
                or steps.position.completed_epochs >= schedule.max_num_epochs
                or stop_for_deadline
            )
            if schedule.validates_after(step, is_last):
                steps.validate(step, timer)

            steps.after_step(step, result)
            kept = (
                result.metrics
                if result.kept is None
                else {k: result.metrics[k] for k in result.kept if k in result.metrics}
            )
            state.train_metrics = dict(kept)
            steps.logger.log_metrics(result.metrics, step, prefix="train")
            for prefix, metrics in result.logs.items():
                steps.logger.log_metrics(metrics, step, prefix=prefix)
            if result.samples is not None:
                steps.logger.log_samples_jsonl(result.samples, step)
            if should_save(step, steps.checkpointing, is_last) or result.save:
                phase(step, "checkpoint")
                with timer.time("checkpointing"):
                    steps.save()

        timing = {**result.timing, **timer.get_timing_metrics("sum")}
        if startup_time is not None:
            timing["startup_time"], startup_time = startup_time, None
        steps.log_step(step, result, timing)
        advance(step)
        if stop_for_deadline:
            console.print(f"[yellow]checkpointing.checkpoint_must_save_by reached: saved and stopping at step {step}")
            break
    console.print(
        f"Done after step {state.step}. Logs: {steps.log_dir}  Checkpoints: {steps.checkpointing.checkpoint_dir}"
    )
