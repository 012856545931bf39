"""What rollout-based algorithms that run a second model beside the actor share (distillation's frozen teacher, PPO's
trained critic): building the run with that model on the training cluster, and the plumbing of their step around the
synchronous rollouts of the actor.

An algorithm on these pieces writes only its config, its ``train_step``, ``save`` and ``log_step``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from nemo_rl_clone.algorithms.run.loop import Schedule
from nemo_rl_clone.algorithms.run.rollout import GivenParts, log_validation, setup_rollout_run
from nemo_rl_clone.models.policy.lm_policy import Policy
from nemo_rl_clone.rollout.run import RolloutRun
from nemo_rl_clone.rollout.step_rollouts import SyncRollouts
from nemo_rl_clone.utils.checkpoint import CheckpointingConfig
from nemo_rl_clone.utils.timer import Timer
from nemo_rl_clone.utils.watchdog import WatchdogConfig


def setup_with_model(
    config: Any,
    loss_fn: Any,
    build: Callable[[RolloutRun[Any], dict[str, str]], Policy],
    given: GivenParts | None = None,
) -> tuple[RolloutRun[Any], Policy]:
    """The actor's rollout run (`setup_rollout_run`, its policy trained with ``loss_fn``; ``given``: the tokenizer
    and datasets a NeMo-RL-style caller built), then ``build(run, env_vars)``: the second model, on the run's
    training cluster. If building it fails, the run is shut down before the error propagates."""
    run = setup_rollout_run(config, loss_fn, extra_worker_groups=1, given=given)
    try:
        # On CPU the two models' workers take turns on the same cores: each may use all of them while it runs.
        threads = {} if torch.cuda.is_available() else {"OMP_NUM_THREADS": str(os.cpu_count() or 1)}
        return run, build(run, threads)
    except BaseException:
        run.shutdown()
        raise


class SyncRolloutSteps:
    """A `run.loop.StepAlgorithm` whose samples come from the synchronous rollouts of the actor ``run``: the
    engines get the actor's new weights before they next sample or validate. ``section`` is the algorithm's loop
    section (``max_num_steps``, ``max_num_epochs``, ``val_period``, ``val_at_start``, ``val_at_end``). A subclass
    gives ``train_step``, ``save`` and ``log_step``, and sets ``actor_trained`` False after a step that left the
    actor's weights unchanged (no refit follows it)."""

    def __init__(
        self,
        title: str,
        run: RolloutRun[Any],
        section: Any,
        checkpointing: CheckpointingConfig,
        watchdog: WatchdogConfig,
    ) -> None:
        self.run, self.state, self.logger, self.watchdog = run, run.state, run.logger, watchdog
        self.checkpointer, self.checkpointing, self.log_dir = run.checkpointer, checkpointing, run.log_dir
        self.schedule = Schedule.for_rollouts(title, section)
        self.source = SyncRollouts(run)
        self.actor_trained = True

    @property
    def position(self) -> Any:
        return self.run.dataloader

    def start(self, timer: Timer) -> None:
        pass

    def sync_weights(self, step: int, timer: Timer) -> None:
        if self.actor_trained:
            self.source.after_training(step, timer)

    def validate(self, step: int, timer: Timer) -> None:
        self.source.validate(step, timer, partial(log_validation, self.run, step))

    def after_step(self, step: int, result: Any) -> None:
        pass

    def close(self) -> None:
        self.source.close()
