"""What algorithms that run GRPO's actor machinery beside a second model share (distillation's frozen teacher, PPO's
trained critic): building the run with that model on the training cluster, the plumbing of their step around GRPO's
synchronous rollouts, and the algorithm hooks answered from the GRPO view of their config (``rollout_view()``).

An algorithm on these pieces writes only its config, its ``train_step``, ``save`` and ``log_step``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from nemo_rl_clone.algorithms.grpo.components import GRPOComponents, setup
from nemo_rl_clone.algorithms.grpo.train import ALGORITHM as GRPO_ALGORITHM
from nemo_rl_clone.algorithms.grpo.train import log_validation, response_token_share
from nemo_rl_clone.algorithms.interfaces import Algorithm
from nemo_rl_clone.algorithms.run.loop import Schedule
from nemo_rl_clone.models.policy.lm_policy import Policy
from nemo_rl_clone.rollout.step_rollouts import SyncRollouts
from nemo_rl_clone.utils.checkpoint import CheckpointingConfig
from nemo_rl_clone.utils.timer import Timer


def setup_with_model(
    config: Any, build: Callable[[GRPOComponents, dict[str, str]], Policy]
) -> tuple[GRPOComponents, Policy]:
    """GRPO's run built from ``config.rollout_view()`` (``config.yaml`` and the logged hyperparameters hold
    ``config`` itself), then ``build(run, env_vars)``: the second model, on the run's training cluster. If building it
    fails, the run is shut down before the error propagates."""
    run = setup(config.rollout_view(), extra_worker_groups=1, run_config=config)
    try:
        # On CPU the two models' workers take turns on the same cores: each may use all of them while it runs.
        threads = {} if torch.cuda.is_available() else {"OMP_NUM_THREADS": str(os.cpu_count() or 1)}
        return run, build(run, threads)
    except BaseException:
        run.shutdown()
        raise


class SyncRolloutSteps:
    """A `run.loop.StepAlgorithm` whose samples come from GRPO's synchronous rollouts of the actor ``run``: the
    engines get the actor's new weights before they next sample or validate. ``section`` is the algorithm's loop
    section (``max_num_steps``, ``max_num_epochs``, ``val_period``, ``val_at_start``, ``val_at_end``). A subclass
    gives ``train_step``, ``save`` and ``log_step``, and sets ``actor_trained`` False after a step that left the
    actor's weights unchanged (no refit follows it)."""

    def __init__(self, title: str, run: GRPOComponents, section: Any, checkpointing: CheckpointingConfig) -> None:
        self.run, self.state, self.logger = run, run.state, run.logger
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


class SecondModelAlgorithm(Algorithm):
    """An `Algorithm` whose actor samples as GRPO's policy does: the data, the loss's token share and multi-turn
    rollouts are those of the config's GRPO view."""

    def datasets(self, config: Any, tokenizer: Any) -> tuple[Any, Any, int | None]:
        return GRPO_ALGORITHM.datasets(config.rollout_view(), tokenizer)

    def loss_token_share(self, config: Any) -> float:
        return response_token_share(config.rollout_view())

    def multi_turn(self, config: Any) -> bool:
        return GRPO_ALGORITHM.multi_turn(config.rollout_view())
