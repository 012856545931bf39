"""Between NeMo-RL's form of a rollout algorithm's entry points and this library's run: NeMo-RL's ``setup`` returns a
run's parts as a tuple and its train function takes them back one by one. `validation_loader` is the validation
loader that tuple holds; `run_from_parts` puts the train function's arguments back together as the `RolloutRun`
the one loop trains. GRPO, PPO and distillation share them (their ``nemo_rl_api`` modules)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch.utils.data import DataLoader

from nemo_rl_clone.data.collate_fn import rl_collate_fn
from nemo_rl_clone.rollout.run import RolloutRun


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
