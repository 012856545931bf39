"""Pre-flight: every check of a validated config that needs the machine or the files it names, run by the entry
points before Ray starts and before any log or checkpoint directory is created. Each check lives with its component
(model sources in ``models/huggingface.py``, data files in ``data/checks.py``, optimizer and scheduler in
``models/policy/optim.py``, cluster shape and Ray's port in ``distributed/virtual_cluster.py``, directories in
``utils/run_dirs.py``); this module composes them by the sections a config has, for GRPO, SFT, DPO, RM and
evaluation alike.

    preflight(config)                     # raises UserInputError listing every problem, one line each
    with removed_if_run_start_fails(config):
        run = setup(config)               # a failure here removes the new exp_N / checkpoint dir again

`run_training` is that sequence for the training entry points (GRPO, SFT, DPO, RM).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

from nemo_rl_clone.utils.errors import UserInputError, reporting_user_errors
from nemo_rl_clone.utils.run_dirs import check_writable_dir, removed_if_start_fails


def preflight(config: Any) -> None:
    """Check what ``config`` names on this machine; raise one `UserInputError` with a line per problem."""
    problems = [*_directory_problems(config), *_cluster_problems(config)]
    policy = getattr(config, "policy", None)
    if policy is not None:
        problems.extend(_policy_problems(config, policy))
    if getattr(config, "data", None) is not None:
        from nemo_rl_clone.data.checks import check_data_config

        problems.extend(check_data_config(config.data))
    if problems:
        raise UserInputError(*problems)


class _Run(Protocol):
    def shutdown(self) -> None: ...


_R = TypeVar("_R", bound=_Run)


def run_training(config: Any, setup: Callable[[Any], _R], train: Callable[[_R], None]) -> None:
    """A training entry point's work: pre-flight, setup (its directories removed again if it fails), train, shut
    down; bad input anywhere ends as ``error:`` lines and exit code 2 (`reporting_user_errors`)."""
    with reporting_user_errors():
        preflight(config)
        with removed_if_run_start_fails(config):
            run = setup(config)
        try:
            train(run)
        finally:
            run.shutdown()


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
    from nemo_rl_clone.distributed.virtual_cluster import (
        check_local_cluster_fits,
        check_ray_port_free,
        starts_local_ray,
    )

    if not starts_local_ray():  # attaching to a running cluster: its shape is checked when bundles are reserved
        return []
    import torch

    cluster = config.cluster
    slots = {"cluster.gpus_per_node * cluster.num_nodes": cluster.gpus_per_node * cluster.num_nodes}
    generation = getattr(getattr(config, "policy", None), "generation", None)
    if generation is not None and not generation.colocated.enabled:
        resources = generation.colocated.resources
        key = "policy.generation.colocated.resources.gpus_per_node * num_nodes"
        slots[key] = (resources.gpus_per_node or 0) * (resources.num_nodes or 0)
    problems = check_local_cluster_fits(slots, use_gpus=torch.cuda.is_available())
    port_problem = check_ray_port_free()
    return problems if port_problem is None else [*problems, port_problem]


def _policy_problems(config: Any, policy: Any) -> list[str]:
    from nemo_rl_clone.models.huggingface import check_model_source
    from nemo_rl_clone.models.policy.optim import OptimizerConfigError, check_optimizer_and_scheduler

    problems = []
    model_problem = check_model_source(policy.model_name, "policy.model_name")
    if model_problem is not None:
        problems.append(model_problem)
    workers = config.cluster.gpus_per_node * config.cluster.num_nodes
    model_parallel = policy.model_parallel_size()
    if policy.megatron_cfg.enabled:
        divisor = "tensor_model_parallel_size * pipeline_model_parallel_size"
        key = f"policy.megatron_cfg.{divisor}"
    else:
        key, divisor = "policy.dtensor_cfg.tensor_parallel_size", "tensor_parallel_size"
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
