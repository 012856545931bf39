"""SFT's, DPO's and RM's entry points in NeMo-RL v0.7.0's form, on this library's one supervised setup and loop.

NeMo-RL's ``run_sft.py`` / ``run_dpo.py`` / ``run_rm.py`` build the tokenizer and the datasets themselves, call
``setup(master_config, tokenizer, train_dataset, val_dataset)`` for the rest (a 9-tuple) and hand those parts to
``sft_train`` / ``dpo_train`` / ``rm_train``. Here that setup validates the master config once and builds this
library's `SupervisedRun` with the caller's tokenizer and datasets (`build_supervised_run`); the train function puts
the parts back together as that run and trains it with `supervised_train`. Each algorithm's module keeps its
one-argument forms, ``setup(config)`` → the run and ``*_train(run)``, and passes its `SupervisedEntry` here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader

from nemo_rl_clone.algorithms.run.preflight import preflight
from nemo_rl_clone.algorithms.supervised.config import SupervisedAlgorithm
from nemo_rl_clone.algorithms.supervised.loop import supervised_train
from nemo_rl_clone.algorithms.supervised.setup import (
    SupervisedRun,
    build_supervised_run,
    padded_collate,
    validation_batches,
)
from nemo_rl_clone.utils.config_validation import as_config
from nemo_rl_clone.utils.errors import UserInputError

__all__ = ["SupervisedEntry", "run_from_parts", "setup_parts"]


@dataclass(frozen=True)
class SupervisedEntry:
    """What differs between SFT's, DPO's and RM's NeMo-RL form: the master config's ``schema``, the ``algorithm``
    class (built from a loss) and the ``loss`` its setup builds from the validated config."""

    schema: type
    algorithm: type[SupervisedAlgorithm]
    loss: Callable[[Any], Any]


def setup_parts(
    entry: SupervisedEntry, master_config: Any, tokenizer: Any, train_dataset: Any, val_dataset: Any
) -> Any:
    """NeMo-RL's 9-tuple ``(policy, cluster, train_dataloader, val_dataloader, loss_fn, logger, checkpointer,
    save_state, master_config)`` of the run built on the caller's ``tokenizer`` and datasets; ``val_dataloader``
    batches the validation set by ``<section>.val_global_batch_size`` (None without one), ``master_config`` is the
    validated config. The run logs into ``logger.log_dir`` as given (the script chose its ``exp_N``)."""
    if tokenizer is None or train_dataset is None:
        raise UserInputError(
            "tokenizer, train_dataset: both required in NeMo-RL's form of setup (or pass the config alone)"
        )
    config: Any = as_config(_data_as_configured(master_config), entry.schema)
    preflight(config)
    algorithm = entry.algorithm(entry.loss(config))
    collate = _collate(algorithm, config, tokenizer)
    run = build_supervised_run(config, algorithm, tokenizer, train_dataset, val_dataset, collate, log_dir_as_given=True)
    val_dataloader = None
    if val_dataset is not None:
        batch_size = run.loop.val_global_batch_size
        val_dataloader = DataLoader(val_dataset, batch_size=batch_size, shuffle=False, collate_fn=collate)
    return (
        run.policy,
        run.cluster,
        run.dataloader,
        val_dataloader,
        algorithm.loss_fn,
        run.logger,
        run.checkpointer,
        run.state,
        run.config,
    )


def run_from_parts(
    entry: SupervisedEntry,
    policy: Any,
    loaders: tuple[Any, Any],
    tokenizer: Any,
    loss_fn: Any,
    master_config: Any,
    records: tuple[Any, Any, Any],
) -> SupervisedRun:
    """The run NeMo-RL's train arguments form: ``loaders`` (training, validation: its dataset and collate function
    give the validation batches), ``records`` (logger, checkpointer, save state); ``master_config`` validated (once:
    `setup_parts` returns it validated). The cluster stays the caller's: training does not shut it down."""
    if master_config is None:
        raise UserInputError("master_config: required by the train function with NeMo-RL's arguments")
    config: Any = as_config(master_config, entry.schema)
    algorithm = entry.algorithm(loss_fn)
    train_dataloader, val_dataloader = loaders
    logger, checkpointer, state = records
    loop = getattr(config, algorithm.section)
    val_dataset, collate = None, _collate(algorithm, config, tokenizer)
    if val_dataloader is not None:
        val_dataset, collate = val_dataloader.dataset, val_dataloader.collate_fn
    return SupervisedRun(
        config=config,
        loop=loop,
        algorithm=algorithm,
        tokenizer=tokenizer,
        policy=policy,
        dataloader=train_dataloader,
        val_batches=validation_batches(val_dataset, loop, collate, algorithm.section),
        logger=logger,
        checkpointer=checkpointer,
        state=state,
        log_dir=logger.log_dir,
        cluster=None,
    )


def train_parts(entry: SupervisedEntry, policy: Any, *parts: Any) -> None:
    """``*_train``: the run ``setup(config)`` built (``policy`` is it), or NeMo-RL's eight further arguments
    ``(train_dataloader, val_dataloader, tokenizer, loss_fn, master_config, logger, checkpointer, save_state)``."""
    if isinstance(policy, SupervisedRun):
        supervised_train(policy)
        return
    train_dataloader, val_dataloader, tokenizer, loss_fn, master_config, logger, checkpointer, state = parts
    run = run_from_parts(
        entry,
        policy,
        (train_dataloader, val_dataloader),
        tokenizer,
        loss_fn,
        master_config,
        (logger, checkpointer, state),
    )
    supervised_train(run)


def _data_as_configured(master_config: Any) -> Any:
    """``master_config`` with its ``data`` section as the recipe wrote it: NeMo-RL's ``run_sft.py`` loads its
    datasets by editing that section in place, turning ``data.train`` / ``data.validation`` into one-entry lists and
    copying ``data.default``'s keys into each entry. Several entries stay a list (refused in one line)."""
    plain = isinstance(master_config, Mapping)
    data = master_config.get("data") if plain else getattr(master_config, "data", None)
    if not isinstance(data, Mapping):
        return master_config  # typed: nothing edited it
    default = data.get("default") or {}
    restored = dict(data)
    for key in ("train", "validation"):
        value = data.get(key)
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if isinstance(value, Mapping):
            value = {k: v for k, v in value.items() if k not in default or v != default[k]}
        restored[key] = value
    return {**master_config, "data": restored} if plain else dataclasses.replace(master_config, data=restored)


def _collate(algorithm: SupervisedAlgorithm, config: Any, tokenizer: Any) -> Callable[..., Any]:
    """A pair fills two rows (DPO, RM): the preference collate; one conversation one row (SFT): the SFT collate."""
    from nemo_rl_clone.data.supervised import preference_collate_fn, sft_collate_fn

    collate_fn = preference_collate_fn if algorithm.rows_per_example == 2 else sft_collate_fn
    return lambda datums: padded_collate(collate_fn, config, tokenizer)(datums)  # the tokenizer is read when used
