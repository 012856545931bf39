"""Pre-flight: every check of a validated config that needs the machine or the files it names, run by the entry
points before Ray starts and before any log or checkpoint directory is created. Each check lives with its component
(model sources in ``models/huggingface.py``, data files in ``data/checks.py``, optimizer and scheduler in
``models/policy/workers/optim.py``, cluster shape in ``distributed/cluster_fit.py``, Ray's port in
``distributed/ports.py``, directories in ``utils/run_dirs.py``); this module composes them by the sections a
config has, for GRPO, SFT, DPO, RM and evaluation alike. A run on a running Ray cluster (``RAY_ADDRESS``, ``ray job
submit``) connects to it here, to check cluster.* against its nodes.

    preflight(config)                     # raises UserInputError listing every problem, one line each
    with removed_if_run_start_fails(config):
        run = setup(config)               # a failure here removes the new exp_N / checkpoint dir again

`run.cli.run_training` is that sequence for the training entry points; with ``--dry-run`` they run `run.dry_run`
instead (these checks, then tokenizer, data, chat template and the memory plan; docs/preflight.md).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from nemo_rl_clone.algorithms import registry
from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.utils.run_dirs import check_writable_dir, removed_if_start_fails

logger = logging.getLogger(__name__)


def preflight(config: Any) -> None:
    """Check what ``config`` names on this machine; raise one `UserInputError` with a line per problem."""
    problems = [*_directory_problems(config), *_cluster_problems(config)]
    policy = getattr(config, "policy", None)
    if policy is not None:
        problems.extend(_policy_problems(config, policy))
    algorithm = registry.algorithm_for(config)
    others = {**algorithm.frozen_models(config), **algorithm.trained_models(config)} if algorithm else {}
    for section, model in others.items():  # distillation's teacher, PPO's critic
        problems.extend(_other_model_problems(config, section, model))
    problems.extend(_engine_layout_problems(config))
    if getattr(config, "data", None) is not None:
        from nemo_rl_clone.data.checks import check_data_config

        problems.extend(check_data_config(config.data))
    if problems:
        raise UserInputError(*problems)


@contextlib.contextmanager
def removed_if_run_start_fails(config: Any) -> Iterator[None]:
    """Around a run's setup: if it raises, stop Ray and remove the log / checkpoint directories (or the new
    ``exp_N`` in an existing log dir) that the failed start created."""
    with removed_if_start_fails(_run_dirs(config), before_removal=_stop_ray):
        yield


def _run_dirs(config: Any) -> list[str]:
    dirs = []
    if getattr(config, "logger", None) is not None:
        dirs.append(config.logger.log_dir)
    checkpointing = getattr(config, "checkpointing", None)
    if checkpointing is not None and checkpointing.enabled:
        dirs.append(checkpointing.checkpoint_dir)
    return dirs


def _stop_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


def _directory_problems(config: Any) -> list[str]:
    problems = []
    if getattr(config, "logger", None) is not None:
        problems.append(check_writable_dir(config.logger.log_dir, "logger.log_dir"))
    checkpointing = getattr(config, "checkpointing", None)
    if checkpointing is not None and checkpointing.enabled:
        problems.append(check_writable_dir(checkpointing.checkpoint_dir, "checkpointing.checkpoint_dir"))
    save_path = getattr(getattr(config, "eval", None), "save_path", None)
    if save_path:
        from pathlib import Path

        problems.append(check_writable_dir(Path(save_path).parent, "eval.save_path"))
    return [p for p in problems if p is not None]


def _cluster_problems(config: Any) -> list[str]:
    import torch

    from nemo_rl_clone.distributed.cluster_fit import check_local_cluster_fits
    from nemo_rl_clone.distributed.ports import check_ray_port_free
    from nemo_rl_clone.distributed.ray_startup import starts_local_ray

    shapes = _worker_shapes(config)
    use_gpus = torch.cuda.is_available()  # as the setups decide it
    if not starts_local_ray():
        return _attached_cluster_problems(shapes, use_gpus)
    slots = {"cluster.gpus_per_node * cluster.num_nodes": _slots(shapes["cluster"])}
    if _GENERATION in shapes:
        slots[f"{_GENERATION}.gpus_per_node * num_nodes"] = _slots(shapes[_GENERATION])
    problems = check_local_cluster_fits(slots, use_gpus=use_gpus)
    port_problem = check_ray_port_free()
    return problems if port_problem is None else [*problems, port_problem]


_GENERATION = "policy.generation.colocated.resources"


def _worker_shapes(config: Any) -> dict[str, tuple[int, int]]:
    """``(gpus_per_node, num_nodes)`` of every group of worker slots the run reserves, by config section."""
    shapes = {"cluster": (config.cluster.gpus_per_node, config.cluster.num_nodes)}
    generation = getattr(getattr(config, "policy", None), "generation", None)
    if generation is not None and not generation.colocated.enabled:
        resources = generation.colocated.resources
        shapes[_GENERATION] = (resources.gpus_per_node or 0, resources.num_nodes or 0)
    return shapes


def _slots(shape: tuple[int, int]) -> int:
    return shape[0] * shape[1]


def _attached_cluster_problems(shapes: dict[str, tuple[int, int]], use_gpus: bool) -> list[str]:
    """cluster.* against a running cluster (``RAY_ADDRESS``, ``ray job submit``): connecting starts no Ray process,
    and the run's setup reuses the connection. Without this, a shape the cluster cannot hold waits out the placement-group
    timeout (3 min) and then fails with a long message."""
    import ray

    from nemo_rl_clone.distributed.cluster_fit import check_cluster_shape, ray_node_resources
    from nemo_rl_clone.distributed.ray_startup import init_ray

    init_ray()
    nodes = ray_node_resources()
    if not use_gpus and any(node.gpus for node in nodes):
        logger.warning(
            "This driver sees no CUDA device, so workers get CPU-only bundles although the Ray cluster has GPUs; "
            "run the driver on a GPU node to train on them"
        )
    where = f"the Ray cluster at {ray.get_runtime_context().gcs_address}"
    return check_cluster_shape(nodes, shapes, use_gpus, where)


def _other_model_problems(config: Any, section: str, model: Any) -> list[str]:
    """A model besides the policy on the training workers: its source, and its model parallelism against them."""
    from nemo_rl_clone.models.huggingface import check_model_source

    problems = []
    model_problem = check_model_source(model.model_name, f"{section}.model_name")
    if model_problem is not None:
        problems.append(model_problem)
    workers = config.cluster.gpus_per_node * config.cluster.num_nodes
    if workers % model.model_parallel_size():
        problems.append(
            f"{section}.dtensor_cfg.tensor_parallel_size: {model.model_parallel_size()} must divide the {workers} "
            "workers of cluster.*"
        )
    return problems


def _policy_problems(config: Any, policy: Any) -> list[str]:
    from nemo_rl_clone.models.huggingface import check_model_source
    from nemo_rl_clone.models.policy.backends import backend_spec, parallel_layout
    from nemo_rl_clone.models.policy.workers.optim import OptimizerConfigError, check_optimizer_and_scheduler

    problems = []
    model_problem = check_model_source(policy.model_name, "policy.model_name")
    if model_problem is not None:
        problems.append(model_problem)
    workers = config.cluster.gpus_per_node * config.cluster.num_nodes
    layout = parallel_layout(policy, backend_spec(policy))
    model_parallel, key, divisor = layout.model_parallel_size, f"policy.{layout.divisor_key}", layout.divisor
    if workers % model_parallel:
        problems.append(f"{key}: {model_parallel} must divide the {workers} workers of cluster.*")
    elif policy.train_global_batch_size % (workers // model_parallel):
        problems.append(
            f"policy.train_global_batch_size: {policy.train_global_batch_size} must be a multiple of the "
            f"data-parallel size {workers // model_parallel} (cluster.gpus_per_node * cluster.num_nodes / {divisor})"
        )
    if policy.optimizer is not None:  # null with the Megatron backend, which builds its own optimizer
        try:
            check_optimizer_and_scheduler(policy.optimizer, policy.scheduler)
        except OptimizerConfigError as error:
            problems.append(str(error))
    return problems


def _engine_layout_problems(config: Any) -> list[str]:
    """vLLM engines of several ranks against the generation devices of a node and against the model's heads,
    layers and experts (`engine_layout`): before any actor starts, instead of at engine start."""
    from nemo_rl_clone.models.generation.engine_layout import engine_split_problem, model_layout_problems

    policy = getattr(config, "policy", None)
    generation = getattr(policy, "generation", None) if policy is not None else getattr(config, "generation", None)
    if generation is None or generation.backend != "vllm":
        return []
    prefix = "policy.generation" if policy is not None else "generation"
    vllm_cfg = generation.vllm_cfg
    if generation.colocated.enabled:
        devices, devices_key = config.cluster.gpus_per_node, "cluster.gpus_per_node"
    else:
        devices, devices_key = generation.colocated.resources.gpus_per_node or 0, f"{_GENERATION}.gpus_per_node"
    problems = []
    split = engine_split_problem(vllm_cfg.devices_per_engine, devices, "a node's", devices_key) if devices else None
    if split is not None:
        problems.append(f"{prefix}.vllm_cfg: {split}")
    if vllm_cfg.devices_per_engine > 1 or vllm_cfg.uses_expert_parallel:  # nothing to split otherwise
        hf_config = _engine_model_config(policy, generation)
        if hf_config is not None:
            problems.extend(model_layout_problems(vllm_cfg, hf_config, f"{prefix}.vllm_cfg"))
    return problems


def _engine_model_config(policy: Any, generation: Any) -> Any:
    """The engines' model config (the policy's overrides applied), read from a local folder or the hub's local
    cache only; None when it is not there or does not load (the model-source check reports why) or names a
    training checkpoint (an evaluation exports it only when the run starts)."""
    import os

    from huggingface_hub import try_to_load_from_cache

    from nemo_rl_clone.models.huggingface import load_hf_config, resolve_model_path

    model = policy.model_name if policy is not None else generation.model_name
    overrides = policy.hf_config_overrides if policy is not None else None
    try:
        folder = resolve_model_path(model)
        if not os.path.isdir(folder):  # a hub id: no network here, the engine's start checks it otherwise
            cached = try_to_load_from_cache(folder, "config.json")
            if not isinstance(cached, str):
                return None
            folder = os.path.dirname(cached)
        return load_hf_config(folder, overrides)
    except (OSError, ValueError):
        return None
