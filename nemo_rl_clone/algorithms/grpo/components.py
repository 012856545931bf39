"""Everything a GRPO run needs before its first step: data, environments, clusters, policy, engines, logger and
checkpoint state (restored from the latest checkpoint when there is one)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import datasets
import torch

from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
from nemo_rl_clone.algorithms.loss.registry import build_loss
from nemo_rl_clone.algorithms.run.setup import setup_run
from nemo_rl_clone.algorithms.run.state import RunState, save_run_checkpoint
from nemo_rl_clone.contract.sampling import TrainingSamplingParams
from nemo_rl_clone.data.collate_fn import rl_collate_fn
from nemo_rl_clone.data.config import DataConfig
from nemo_rl_clone.data.dataloader import StatefulPromptLoader
from nemo_rl_clone.data.datasets import DataError, load_dataset_by_name, load_dataset_from_config, seed_argument
from nemo_rl_clone.data.datasets.common import AllTaskProcessedDataset
from nemo_rl_clone.data.interfaces import TaskDataSpec
from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl_clone.environments import create_env
from nemo_rl_clone.models.generation.factory import build_generation
from nemo_rl_clone.models.generation.interfaces import GenerationInterface
from nemo_rl_clone.models.policy.lm_policy import Policy
from nemo_rl_clone.rollout.refit import init_refit_collective, prepare_refit
from nemo_rl_clone.rollout.run import RolloutRun
from nemo_rl_clone.utils.config_validation import as_config

# GRPO's checkpointed state is the run state every algorithm shares.
GRPOState = RunState


# GRPO's run: the rollout machinery's run with GRPO's config.
GRPOComponents = RolloutRun[GRPOMasterConfig]


def setup(
    config: GRPOMasterConfig | Mapping[str, Any], extra_worker_groups: int = 0, run_config: Any = None
) -> GRPOComponents:
    """Build a GRPO run from a config (validated here when given as NeMo-RL's plain dict); resumes from
    ``checkpointing.checkpoint_dir`` if it holds one.

    Algorithms built on GRPO's pieces (distillation) pass ``extra_worker_groups`` (more worker groups that will
    share the training cluster's bundles, e.g. a teacher policy) and ``run_config`` (the config that
    ``config.yaml`` and the logged hyperparameters hold instead of ``config``)."""
    config = as_config(config, GRPOMasterConfig)
    tokenizer = config.policy.tokenizer.load(config.policy.model_name)
    start = setup_run(
        config if run_config is None else run_config,
        config.grpo.seed,
        tokenizer,
        lambda: setup_data(config, tokenizer),
        after_ray=lambda: {name: create_env(name, env_cfg) for name, env_cfg in config.env.items()},
    )
    policy, generation, clusters, colocated = _setup_workers(
        config, tokenizer, start.weights_path, start.optimizer_path, extra_worker_groups
    )
    return GRPOComponents(
        config=config,
        tokenizer=tokenizer,
        policy=policy,
        generation=generation,
        dataloader=start.dataloader,
        val_dataset=start.data,
        task_to_env=start.services,
        loss_fn=build_loss(
            config.loss_fn.name,
            "clipped_pg",
            config.loss_fn.loss_config(),
            TrainingSamplingParams.from_generation(config.policy.generation),
        ),
        logger=start.logger,
        checkpointer=start.checkpointer,
        state=start.state,
        colocated=colocated,
        log_dir=start.log_dir,
        clusters=clusters,
    )


def setup_data(config: GRPOMasterConfig, tokenizer: Any) -> tuple[StatefulPromptLoader, AllTaskProcessedDataset | None]:
    seed = config.data.split_seed(config.grpo.seed)
    loaded = load_dataset_from_config(config.data, seed=seed, env=config.env)
    if loaded.train is None:
        raise DataError(f"data.dataset_name: {loaded.name!r} has no training split (it is an evaluation set)")
    validation_rows = _validation_rows(config.data, loaded.validation, seed)
    env_name = config.data.task_name
    spec = TaskDataSpec(
        task_name=env_name, prompt_file=config.data.prompt_file, system_prompt_file=config.data.system_prompt_file
    )
    max_len = config.data.max_input_seq_length
    train = AllTaskProcessedDataset(loaded.train, tokenizer, spec, max_len, env_name=config.data.env_name)
    val = (
        AllTaskProcessedDataset(validation_rows, tokenizer, spec, max_len, env_name=config.data.env_name)
        if validation_rows
        else None
    )
    loader = StatefulPromptLoader(
        train,
        config.grpo.prompts_per_generation_batch,
        rl_collate_fn,
        shuffle=config.data.shuffle,
        seed=config.grpo.seed,
    )
    return loader, val


def _validation_rows(data: DataConfig, own: Any, seed: int) -> Any:
    """The validation rows: the training dataset's own, or those of ``data.validation.dataset_name``; each row
    ``data.validation.repeat`` times."""
    section = data.validation
    if section is None:
        return own
    rows = own
    if section.dataset_name not in (None, data.dataset_name):
        options: dict[str, Any] = dict(seed_argument(section.dataset_name, seed))
        if section.data_path is not None:
            options["data_path"] = section.data_path
        other = load_dataset_by_name(section.dataset_name, **options)
        rows = other.validation if other.validation is not None else other.train
    if rows is None or section.repeat == 1:
        return rows
    if isinstance(rows, datasets.Dataset):
        return datasets.concatenate_datasets([rows] * section.repeat)
    return list(rows) * section.repeat


def save_checkpoint(components: GRPOComponents, loader_position: Any = None) -> Path | None:
    """Write ``step_N`` through ``tmp_step_N`` (atomic rename); the manager prunes to the top-k afterwards.

    ``loader_position`` is what the prompt loader's saved position is read from (default: the loader itself; async
    GRPO passes the position of the last trained rollouts, its collector's loader runs ahead)."""
    c = components
    position = c.dataloader if loader_position is None else loader_position
    return save_run_checkpoint(c.checkpointer, c.policy, position, c.state, c.config)


def _setup_workers(
    config: GRPOMasterConfig,
    tokenizer: Any,
    weights_path: str | None,
    optimizer_path: str | None,
    extra_worker_groups: int = 0,
) -> tuple[Policy, GenerationInterface, list[RayVirtualCluster], bool]:
    """The policy workers and the engines (they start while the policy workers load and shard the model), with the
    refit path between them."""
    use_gpus = torch.cuda.is_available()
    gen_cfg = config.policy.generation
    assert gen_cfg is not None  # GRPOMasterConfig.check guarantees it
    colocated = gen_cfg.colocated.enabled
    clusters = _clusters(config, use_gpus, extra_worker_groups)
    train_cluster, gen_cluster = clusters[0], clusters[-1]
    # On CPU, colocated groups take turns on the same cores: each may use all of them while it runs.
    shared = colocated or extra_worker_groups > 0
    threads = {} if use_gpus or not shared else {"OMP_NUM_THREADS": str(os.cpu_count() or 1)}
    policy = Policy(
        train_cluster,
        config.policy,
        tokenizer,
        weights_path=weights_path,
        optimizer_path=optimizer_path,
        init_reference_model=config.needs_reference_model,
        env_vars=threads,
        wait=False,  # the engines start while the policy workers load and shard the model
    )
    async_grpo = config.grpo.async_grpo
    generation = build_generation(
        gen_cluster,
        gen_cfg,
        config.policy.model_name,
        seed=config.grpo.seed,
        env_vars=threads,
        weight_updates_during_generation=async_grpo.enabled and async_grpo.in_flight_weight_updates,
        hf_config_overrides=config.policy.hf_config_overrides,
        record_routing=config.policy.router_replay.enabled,
    )
    policy.wait_until_ready()
    prepare_refit(policy, generation)
    if not colocated:
        init_refit_collective(policy, generation, train_cluster)
    return policy, generation, clusters, colocated


def _clusters(config: GRPOMasterConfig, use_gpus: bool, extra_worker_groups: int) -> list[RayVirtualCluster]:
    """Colocated: one cluster, two worker groups time-sharing its bundles. Otherwise a cluster each (training
    first, then generation)."""
    gen_cfg = config.policy.generation
    assert gen_cfg is not None  # GRPOMasterConfig.check guarantees it
    colocated = gen_cfg.colocated.enabled
    bundles = [config.cluster.gpus_per_node] * config.cluster.num_nodes
    ports = {
        "port_range_low": config.cluster.master_port_range_low,
        "port_range_high": config.cluster.master_port_range_high,
    }
    train_cluster = RayVirtualCluster(
        bundles,
        use_gpus=use_gpus,
        max_colocated_worker_groups=(2 if colocated else 1) + extra_worker_groups,
        num_gpus_per_node=config.cluster.gpus_per_node,
        name="grpo_train",
        **ports,
    )
    if colocated:
        return [train_cluster]
    resources = gen_cfg.colocated.resources
    assert resources.gpus_per_node is not None and resources.num_nodes is not None  # ColocatedConfig.check
    gen_cluster = RayVirtualCluster(
        [resources.gpus_per_node] * resources.num_nodes,
        use_gpus=use_gpus,
        num_gpus_per_node=resources.gpus_per_node,
        name="grpo_generation",
        **ports,
    )
    return [train_cluster, gen_cluster]


def replay_loss(section: Mapping[str, Any], sampling: TrainingSamplingParams) -> Any:
    """GRPO's loss from a repro bundle's ``loss_fn`` section (`rollout.replay.replay`'s ``make_loss``); raises
    `ConfigError` on a bad key."""
    from nemo_rl_clone.algorithms.loss.registry import ClippedPGLossSection
    from nemo_rl_clone.utils.config_validation import validate_config

    loss_cfg = validate_config(dict(section), ClippedPGLossSection)
    return build_loss(loss_cfg.name, "clipped_pg", loss_cfg.loss_config(), sampling)
