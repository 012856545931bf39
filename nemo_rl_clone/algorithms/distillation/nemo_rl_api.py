"""Distillation's entry points with NeMo-RL v0.7.0's signatures, on this library's one distillation setup and one
train loop.

NeMo-RL's ``run_distillation.py`` builds the tokenizer, the datasets and the environments itself, then calls
``setup(master_config, tokenizer, train_dataset, val_dataset)`` for the rest (an 11-tuple) and hands those parts to
``distillation_train(...)``. Here ``setup`` validates the master config once and builds this library's run with the
caller's tokenizer and datasets; ``distillation_train`` puts the parts back together as that run and trains it with
`train.DistillationSteps`. The one-argument forms, ``setup(config)`` → `train.DistillationComponents` and
``distillation_train(run)``, work as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_rl_clone.algorithms.distillation.config import DistillationMasterConfig
from nemo_rl_clone.algorithms.distillation.train import DistillationComponents
from nemo_rl_clone.algorithms.distillation.train import distillation_train as train_distillation_run
from nemo_rl_clone.algorithms.distillation.train import setup as build_distillation_run
from nemo_rl_clone.algorithms.grpo.nemo_rl_helpers import TokenizerType
from nemo_rl_clone.algorithms.run.nemo_rl_parts import run_from_parts, setup_config, train_config, validation_loader
from nemo_rl_clone.algorithms.run.rollout import GivenParts
from nemo_rl_clone.algorithms.run.state import RunState
from nemo_rl_clone.utils.errors import UserInputError

__all__ = ["DistillationSaveState", "TokenizerType", "distillation_train", "setup"]

# NeMo-RL's name of the state its checkpoints store: every algorithm here saves the one shared RunState
DistillationSaveState = RunState


def setup(master_config: Any, tokenizer: Any = None, train_dataset: Any = None, val_dataset: Any = None) -> Any:
    """NeMo-RL's form (a ``tokenizer`` and the prompt ``train_dataset`` given): the run's parts as NeMo-RL's
    11-tuple ``(student_policy, teacher_policy, student_generation, nemo_gym, dataloader, val_dataloader, loss_fn,
    logger, checkpointer, distillation_save_state, master_config)``; no NeMo-Gym actor (None) and ``master_config``
    the validated config. Without them: this library's run (`train.setup`).

    ``master_config`` may be a `MasterConfig` (its sections typed or NeMo-RL's dicts), a dict or an OmegaConf
    config; it is validated once, here."""
    if tokenizer is None and train_dataset is None:
        return build_distillation_run(master_config)
    config = setup_config(master_config, DistillationMasterConfig, ("train_dataset", train_dataset))
    c = build_distillation_run(config, GivenParts(tokenizer, train_dataset, val_dataset))
    run = c.run
    return (
        run.policy,
        c.teacher,
        run.generation,
        None,
        run.dataloader,
        validation_loader(run),
        c.loss_fn,
        run.logger,
        run.checkpointer,
        run.state,
        c.config,
    )


def distillation_train(
    student_policy: Any,
    teacher_policy: Any = None,
    student_generation: Any = None,
    dataloader: Any = None,
    val_dataloader: Any = None,
    tokenizer: Any = None,
    loss_fn: Any = None,
    task_to_env: Mapping[str, Any] | None = None,
    val_task_to_env: Mapping[str, Any] | None = None,
    logger: Any = None,
    checkpointer: Any = None,
    distillation_save_state: Any = None,
    master_config: Any = None,
) -> None:
    """Train the student until ``distillation.max_num_steps`` (or the data or the save deadline ends it). NeMo-RL's
    form: the parts `setup` returned, the caller's environments and the master config; this library's: one
    argument, the run ``setup(config)`` built."""
    if isinstance(student_policy, DistillationComponents):
        train_distillation_run(student_policy)
        return
    config = train_config(master_config, DistillationMasterConfig, "distillation_train")
    if teacher_policy is None or loss_fn is None:
        raise UserInputError("teacher_policy, loss_fn: required by distillation_train (the ones setup returned)")
    run = run_from_parts(
        config,
        tokenizer,
        (student_policy, student_generation, None),  # the student trains with the distillation loss, not the run's
        (dataloader, val_dataloader),
        (task_to_env, val_task_to_env),
        (logger, checkpointer, distillation_save_state),
    )
    train_distillation_run(DistillationComponents(config, run, teacher_policy, loss_fn))
