"""Between NeMo-RL's form of a rollout algorithm's entry points and this library's run: NeMo-RL's ``setup`` returns a
run's parts as a tuple and its train function takes them back one by one. `validation_loader` is the validation
loader that tuple holds; `run_from_parts` puts the train function's arguments back together as the `RolloutRun`
the one loop trains; `setup_config` and `train_config` are the master config each of them validates. GRPO, PPO and
distillation share them (their ``nemo_rl_api`` modules)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from torch.utils.data import DataLoader

from nemo_rl_clone.algorithms.run.preflight import preflight
from nemo_rl_clone.data.collate_fn import rl_collate_fn
from nemo_rl_clone.rollout.run import RolloutRun
from nemo_rl_clone.utils.config_validation import as_config
from nemo_rl_clone.utils.errors import UserInputError

T = TypeVar("T")


def setup_config(master_config: Any, schema: type[T], dataset: tuple[str, Any], processor: Any = None) -> T:
    """The master config NeMo-RL's form of ``setup`` builds from, validated and preflighted once, after refusing a
    missing prompt dataset (``dataset``: its parameter name and value) and a multimodal ``processor``."""
    name, value = dataset
    if value is None:
        raise UserInputError(f"{name}: required when setup is given a tokenizer (NeMo-RL's form)")
    if processor is not None:
        raise UserInputError("processor: not supported yet: vision and audio inputs (nemo_rl_clone trains text models)")
    config = as_config(master_config, schema)
    preflight(config)
    return config


def train_config(master_config: Any, schema: type[T], train_function: str) -> T:
    """The master config a train function in NeMo-RL's form is given (its last argument), validated."""
    if master_config is None:
        raise UserInputError(f"master_config: required by {train_function} with NeMo-RL's arguments (the last one)")
    return as_config(master_config, schema)


def validation_loader(run: RolloutRun[Any]) -> DataLoader | None:
    """NeMo-RL's validation loader: the validation prompts in batches of the loop section's ``val_batch_size``
    (null: all in one), when the run validates at all."""
    loop = run.config.loop
    if run.val_dataset is None or not (loop.val_period > 0 or loop.val_at_start or loop.val_at_end):
        return None
    batch_size = loop.val_batch_size or len(run.val_dataset)
    return DataLoader(run.val_dataset, batch_size=batch_size, shuffle=False, collate_fn=rl_collate_fn)


def run_from_parts(
    config: Any,
    tokenizer: Any,
    models: tuple[Any, Any, Any],
    loaders: tuple[Any, Any],
    envs: tuple[Mapping[str, Any] | None, Mapping[str, Any] | None],
    records: tuple[Any, Any, Any],
) -> RolloutRun[Any]:
    """The run NeMo-RL's train arguments form: the validated ``config``, ``models`` (policy, generation, loss),
    ``loaders`` (training, validation: its prompts are the run's validation set), ``envs`` (training, validation:
    one table, the training ones winning a shared name), ``records`` (logger, checkpointer, save state)."""
    generation_config = config.policy.generation
    assert generation_config is not None  # every rollout algorithm's config check requires it
    (policy, generation, loss_fn), (dataloader, val_loader) = models, loaders
    task_to_env, val_task_to_env = envs
    logger, checkpointer, state = records
    return RolloutRun(
        config=config,
        tokenizer=tokenizer,
        policy=policy,
        generation=generation,
        dataloader=dataloader,
        val_dataset=None if val_loader is None else val_loader.dataset,
        task_to_env={**(val_task_to_env or {}), **(task_to_env or {})},
        loss_fn=loss_fn,
        logger=logger,
        checkpointer=checkpointer,
        state=state,
        colocated=generation_config.colocated.enabled,
        log_dir=logger.log_dir,
        clusters=[],  # NeMo-RL's train functions are not given the clusters; they stay the caller's
    )
