"""PPO's entry points with NeMo-RL v0.7.0's signatures, on this library's one PPO setup and one train loop.

NeMo-RL's ``run_ppo.py`` builds the tokenizer, the datasets and the environments itself, then calls
``setup(master_config, tokenizer, dataset, val_dataset)`` for the rest (a 12-tuple) and hands those parts to
``ppo_train(...)``. Here ``setup`` validates the master config once and builds this library's PPO run with the
caller's tokenizer and datasets; ``ppo_train`` puts the parts back together as that run and trains it with
`train.PPOSteps`. The one-argument forms, ``setup(config)`` → `train.PPOComponents` and ``ppo_train(run)``, work
as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_rl_clone.algorithms.ppo.config import PPOMasterConfig
from nemo_rl_clone.algorithms.ppo.train import PPOComponents
from nemo_rl_clone.algorithms.ppo.train import ppo_train as train_ppo_run
from nemo_rl_clone.algorithms.ppo.train import setup as build_ppo_run
from nemo_rl_clone.algorithms.run.nemo_rl_parts import run_from_parts, setup_config, train_config, validation_loader
from nemo_rl_clone.algorithms.run.rollout import GivenParts
from nemo_rl_clone.utils.errors import UserInputError

__all__ = ["ppo_train", "setup"]


def setup(
    master_config: Any, tokenizer: Any = None, dataset: Any = None, val_dataset: Any = None, processor: Any = None
) -> Any:
    """NeMo-RL's form (a ``tokenizer`` and the prompt ``dataset`` given): the run's parts as NeMo-RL's 12-tuple
    ``(policy, policy_generation, value_model, cluster, dataloader, val_dataloader, loss_fn, value_loss_fn, logger,
    checkpointer, ppo_save_state, master_config)``; ``value_model`` is the critic, ``cluster`` the (training,
    generation) pair, the same cluster twice when colocated; ``master_config`` the validated config. Without them:
    this library's run (`train.setup`).

    ``master_config`` may be a `MasterConfig` (its sections typed or NeMo-RL's dicts), a dict or an OmegaConf
    config; it is validated once, here."""
    if tokenizer is None and dataset is None:
        return build_ppo_run(master_config)
    config = setup_config(master_config, PPOMasterConfig, ("dataset", dataset), processor)
    c = build_ppo_run(config, GivenParts(tokenizer, dataset, val_dataset))
    run = c.run
    return (
        run.policy,
        run.generation,
        c.critic,
        (run.clusters[0], run.clusters[-1]),
        run.dataloader,
        validation_loader(run),
        run.loss_fn,
        c.value_loss_fn,
        run.logger,
        run.checkpointer,
        run.state,
        c.config,
    )


def ppo_train(
    policy: Any,
    policy_generation: Any = None,
    value_model: Any = None,
    dataloader: Any = None,
    val_dataloader: Any = None,
    tokenizer: Any = None,
    loss_fn: Any = None,
    value_loss_fn: Any = None,
    task_to_env: Mapping[str, Any] | None = None,
    val_task_to_env: Mapping[str, Any] | None = None,
    logger: Any = None,
    checkpointer: Any = None,
    ppo_save_state: Any = None,
    master_config: Any = None,
) -> None:
    """Train PPO until ``ppo.max_num_steps`` (or the data or the save deadline ends it). NeMo-RL's form: the parts
    `setup` returned, the caller's environments and the master config; this library's: one argument, the run
    ``setup(config)`` built."""
    if isinstance(policy, PPOComponents):
        train_ppo_run(policy)
        return
    config = train_config(master_config, PPOMasterConfig, "ppo_train")
    if value_model is None or value_loss_fn is None:
        raise UserInputError("value_model, value_loss_fn: required by ppo_train (the critic setup returned)")
    run = run_from_parts(
        config,
        tokenizer,
        (policy, policy_generation, loss_fn),
        (dataloader, val_dataloader),
        (task_to_env, val_task_to_env),
        (logger, checkpointer, ppo_save_state),
    )
    train_ppo_run(PPOComponents(config, run, value_model, value_loss_fn))
