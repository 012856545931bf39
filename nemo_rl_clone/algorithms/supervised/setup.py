"""Everything an SFT, DPO or reward-model run needs before its first step: data loaders, logger, checkpoint state
(restored from the latest checkpoint when there is one), cluster and policy; and the command line of the examples.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from nemo_rl_clone.algorithms.run.setup import RunStart, give_megatron_its_steps, ray_cluster, setup_run
from nemo_rl_clone.algorithms.run.state import RunState
from nemo_rl_clone.algorithms.supervised.config import PreferenceAlgorithm, SupervisedAlgorithm, SupervisedLoopConfig
from nemo_rl_clone.data.dataloader import IndexedDataset, StatefulPromptLoader
from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.utils.checkpoint import CheckpointManager
from nemo_rl_clone.utils.logger import Logger


@dataclass
class SupervisedRun:
    """Everything `supervised_train` uses. ``val_batches`` are collated once; their prepared form is cached."""

    config: Any
    loop: SupervisedLoopConfig
    algorithm: SupervisedAlgorithm
    tokenizer: Any
    policy: Any
    dataloader: StatefulPromptLoader
    val_batches: list[BatchedDataDict]
    logger: Logger
    checkpointer: CheckpointManager
    state: RunState
    log_dir: Path
    cluster: Any
    prepared_val_batches: list[BatchedDataDict] | None = field(default=None, repr=False)

    def shutdown(self) -> None:
        self.policy.shutdown()
        self.cluster.shutdown()
        self.logger.finish()


def build_supervised_run(
    config: Any,
    algorithm: SupervisedAlgorithm,
    tokenizer: Any,
    train_dataset: IndexedDataset,
    val_dataset: IndexedDataset | None,
    collate_fn: Callable[[list[Any]], BatchedDataDict],
    log_dir_as_given: bool = False,
) -> SupervisedRun:
    """Logger, loaders, checkpoint state (resumed from ``checkpointing.checkpoint_dir`` if it holds one), policy.
    ``log_dir_as_given``: log into ``logger.log_dir`` itself (NeMo-RL's scripts choose the ``exp_N`` before setup)."""
    section = algorithm.section
    loop: SupervisedLoopConfig = getattr(config, section)
    gbs = config.policy.train_global_batch_size
    if len(train_dataset) < gbs:
        raise DataError(
            f"policy.train_global_batch_size: {gbs} examples per step, but the training set of "
            f"data.dataset_name={config.data.dataset_name!r} has only {len(train_dataset)}"
        )
    val_batches = validation_batches(val_dataset, loop, collate_fn, section)
    start = setup_run(
        config,
        loop.seed,
        tokenizer,
        lambda: (
            StatefulPromptLoader(train_dataset, gbs, collate_fn, shuffle=config.data.shuffle, seed=loop.seed),
            None,
        ),
        log_dir_as_given=log_dir_as_given,
    )
    policy, cluster = _build_policy(config, algorithm, tokenizer, start)
    return SupervisedRun(
        config=config,
        loop=loop,
        algorithm=algorithm,
        tokenizer=tokenizer,
        policy=policy,
        dataloader=start.dataloader,
        val_batches=val_batches,
        logger=start.logger,
        checkpointer=start.checkpointer,
        state=start.state,
        log_dir=start.log_dir,
        cluster=cluster,
    )


def _build_policy(
    config: Any, algorithm: SupervisedAlgorithm, tokenizer: Any, start: RunStart[None]
) -> tuple[Any, Any]:
    """(policy, its cluster): one worker group on all the run's bundles, from the restored weights if any."""
    from nemo_rl_clone.models.policy.lm_policy import Policy

    use_gpus = torch.cuda.is_available()
    workers = config.cluster.gpus_per_node * config.cluster.num_nodes
    section = config.cluster
    cluster = ray_cluster(
        section,
        f"{algorithm.section}_cluster",
        use_gpus,
        section.gpus_per_node,
        section.num_nodes,
        collective_timeout_s=config.watchdog.collective_timeout_s,
    )
    # Ray gives CPU actors one thread by default; without a generation engine the workers own all the cores.
    threads = {} if use_gpus else {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // workers))}
    give_megatron_its_steps(config.policy, getattr(config, algorithm.section), start.dataloader.batches_per_epoch)
    policy = Policy(
        cluster,
        config.policy,
        tokenizer,
        weights_path=start.weights_path,
        optimizer_path=start.optimizer_path,
        init_reference_model=algorithm.needs_reference_model,
        env_vars=threads,
    )
    return policy, cluster


def build_preference_run(config: Any, algorithm: PreferenceAlgorithm) -> SupervisedRun:
    """`build_supervised_run` on the preference dataset ``config.data`` names (DPO and RM share this)."""
    from nemo_rl_clone.data.supervised import preference_collate_fn

    tokenizer = config.policy.tokenizer.load(config.policy.model_name)
    train, val = preference_datasets(config, algorithm.section, tokenizer)
    return build_supervised_run(
        config, algorithm, tokenizer, train, val, padded_collate(preference_collate_fn, config, tokenizer)
    )


def padded_collate(
    collate_fn: Callable[..., BatchedDataDict], config: Any, tokenizer: Any
) -> Callable[..., BatchedDataDict]:
    """``collate_fn`` (`data.supervised`'s SFT or preference collate) padding with the tokenizer's pad token to a
    multiple of ``policy.make_sequence_length_divisible_by``."""
    return partial(
        collate_fn,
        pad_token_id=tokenizer.pad_token_id,
        make_sequence_length_divisible_by=config.policy.make_sequence_length_divisible_by,
    )


def preference_datasets(config: Any, section: str, tokenizer: Any) -> tuple[Any, Any]:
    """(train, validation) preference datasets of ``config.data``, seeded by ``<section>.seed`` (DPO and RM)."""
    return preference_data(config.data, tokenizer, config.data.split_seed(getattr(config, section).seed))


def preference_data(data: Any, tokenizer: Any, seed: int) -> tuple[Any, Any]:
    """(train, validation or None) preference datasets of the validated ``data`` section; ``seed`` seeds hold-outs."""
    from nemo_rl_clone.data.supervised import PreferenceDataset, build_datasets, load_preference_dataset

    return build_datasets(PreferenceDataset, load_preference_dataset(data, seed=seed), tokenizer, data)


def validation_batches(
    val_dataset: IndexedDataset | None,
    loop: SupervisedLoopConfig,
    collate_fn: Callable[[list[Any]], BatchedDataDict],
    section: str,
) -> list[BatchedDataDict]:
    """The first ``val_batches`` full batches of the validation set, in order (all of them when ``val_batches`` <= 0)."""
    if loop.val_period <= 0 and not loop.val_at_start:
        return []
    size = loop.val_global_batch_size
    available = len(val_dataset) // size if val_dataset is not None else 0
    if val_dataset is None or available == 0:
        have = "no validation set" if val_dataset is None else f"{len(val_dataset)} validation examples"
        raise DataError(
            f"{section}.val_global_batch_size: validation needs at least one batch of {size} examples, the data has "
            f"{have}; lower it, or disable validation ({section}.val_period=0 {section}.val_at_start=false)"
        )
    count = available if loop.val_batches <= 0 else min(available, loop.val_batches)
    return [collate_fn([val_dataset[i] for i in range(b * size, (b + 1) * size)]) for b in range(count)]
