"""GRPO's entry points with NeMo-RL v0.7.0's signatures, on this library's one setup and one train loop.

NeMo-RL's ``run_grpo.py`` builds the tokenizer, the datasets and the environments itself, then calls
``setup(master_config, tokenizer, dataset, val_dataset)`` for the rest (a 13-tuple) and hands those parts to
``grpo_train(...)`` / ``async_grpo_train(...)``. Here ``setup`` validates the master config once and builds this
library's run from it with the caller's tokenizer and datasets; the train functions put the parts back together as
that run and train it with `train.GRPOSteps`. The one-argument forms, ``setup(config)`` → the run and
``grpo_train(run)``, work as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from nemo_rl_clone.algorithms.grpo.components import setup as build_grpo_run
from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
from nemo_rl_clone.algorithms.grpo.train import grpo_train as train_grpo_run
from nemo_rl_clone.algorithms.run.nemo_rl_parts import run_from_parts, setup_config, train_config, validation_loader
from nemo_rl_clone.algorithms.run.rollout import GivenParts
from nemo_rl_clone.rollout.run import RolloutRun
from nemo_rl_clone.utils.errors import UserInputError

__all__ = ["async_grpo_train", "grpo_train", "setup"]


def setup(
    master_config: Any,
    tokenizer: Any = None,
    dataset: Any = None,
    val_dataset: Any = None,
    processor: Any = None,
    policy_factory: Any = None,
) -> Any:
    """NeMo-RL's form (a ``tokenizer`` and the prompt ``dataset`` given): the run's parts as NeMo-RL's 13-tuple
    ``(policy, policy_generation, nemo_gym, cluster, dataloader, val_dataloader, loss_fn, logger, checkpointer,
    grpo_save_state, master_config, teacher_worker_groups, alias_to_group_alias)``; ``cluster`` is the (training,
    generation) pair, the same cluster twice when colocated; ``master_config`` the validated config; no NeMo-Gym
    actor and no teachers. Without them: this library's run (`components.setup`).

    ``master_config`` may be a `MasterConfig` (its sections typed or NeMo-RL's dicts), a dict or an OmegaConf
    config; it is validated once, here."""
    if tokenizer is None and dataset is None:
        return build_grpo_run(master_config)
    _refuse_unbuilt(dataset)
    config = setup_config(master_config, GRPOMasterConfig, ("dataset", dataset), processor)
    run = build_grpo_run(config, GivenParts(tokenizer, dataset, val_dataset, policy_factory))
    train_cluster, generation_cluster = run.clusters[0], run.clusters[-1]
    return (
        run.policy,
        run.generation,
        None,
        (train_cluster, generation_cluster),
        run.dataloader,
        validation_loader(run),
        run.loss_fn,
        run.logger,
        run.checkpointer,
        run.state,
        run.config,
        {},
        {},
    )


def grpo_train(
    policy: Any,
    policy_generation: Any = None,
    wrapped_dataloader: Any = None,
    val_dataloader: Any = None,
    tokenizer: Any = None,
    loss_fn: Any = None,
    task_to_env: Mapping[str, Any] | None = None,
    val_task_to_env: Mapping[str, Any] | None = None,
    logger: Any = None,
    checkpointer: Any = None,
    grpo_save_state: Any = None,
    master_config: Any = None,
) -> None:
    """Train GRPO until ``grpo.max_num_steps`` (or the data or the save deadline ends it). NeMo-RL's form: the
    parts `setup` returned, the caller's environments and the master config; this library's: one argument, the run
    ``setup(config)`` built."""
    if isinstance(policy, RolloutRun):
        train_grpo_run(policy)
        return
    run = run_from_parts(
        train_config(master_config, GRPOMasterConfig, "grpo_train"),
        tokenizer,
        (policy, policy_generation, loss_fn),
        (wrapped_dataloader, val_dataloader),
        (task_to_env, val_task_to_env),
        (logger, checkpointer, grpo_save_state),
    )
    train_grpo_run(run)


def async_grpo_train(
    policy: Any,
    policy_generation: Any,
    dataloader: Any,
    val_dataloader: Any,
    tokenizer: Any,
    loss_fn: Any,
    task_to_env: Mapping[str, Any],
    val_task_to_env: Mapping[str, Any] | None,
    logger: Any,
    checkpointer: Any,
    grpo_save_state: Any,
    master_config: Any,
    max_trajectory_age_steps: int = 1,
    teacher_worker_groups: Mapping[str, Any] | None = None,
    alias_to_group_alias: Mapping[str, str] | None = None,
) -> None:
    """NeMo-RL's async GRPO: the engines generate the next steps' rollouts while the policy trains, each trained
    rollout at most ``max_trajectory_age_steps`` weight updates old. The engines were built for it by `setup`, so
    ``grpo.async_grpo.enabled`` must be true in the master config."""
    if teacher_worker_groups:
        raise UserInputError(
            "teacher_worker_groups: not supported yet: on-policy distillation inside GRPO (distillation is its own "
            "run: examples/run_distillation_math.py)"
        )
    run = run_from_parts(
        train_config(master_config, GRPOMasterConfig, "async_grpo_train"),
        tokenizer,
        (policy, policy_generation, loss_fn),
        (dataloader, val_dataloader),
        (task_to_env, val_task_to_env),
        (logger, checkpointer, grpo_save_state),
    )
    if not run.config.grpo.async_grpo.enabled:
        raise UserInputError(
            "grpo.async_grpo.enabled: must be true for async_grpo_train (setup builds the engines for async GRPO "
            "from it)"
        )
    grpo = run.config.grpo
    async_grpo = dataclasses.replace(grpo.async_grpo, max_trajectory_age_steps=max_trajectory_age_steps)
    run.config = dataclasses.replace(run.config, grpo=dataclasses.replace(grpo, async_grpo=async_grpo))
    train_grpo_run(run)


def _refuse_unbuilt(dataset: Any) -> None:
    if isinstance(dataset, Mapping):
        raise UserInputError(
            "dataset: not supported yet: one dataloader per dataset (data.use_multiple_dataloader); pass one dataset"
        )
