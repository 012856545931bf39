"""The start every algorithm's setup shares: seeds, the log folder with the config dump, the logger, the data, the
checkpoint manager, the model's identity checked against the checkpoint, Ray, and the state restored from the latest
checkpoint."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from nemo_rl_clone.algorithms.run.state import (
    RunState,
    check_checkpoint_model,
    model_identity,
    restore_run_state,
    set_seeds,
)
from nemo_rl_clone.data.dataloader import StatefulPromptLoader
from nemo_rl_clone.utils.checkpoint import CheckpointManager
from nemo_rl_clone.utils.config import save_config
from nemo_rl_clone.utils.config_validation import config_to_dict
from nemo_rl_clone.utils.logger import Logger, get_next_experiment_dir

if TYPE_CHECKING:
    from nemo_rl_clone.distributed.segment_topology import SegmentPlacement
    from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster

DataT = TypeVar("DataT")


@dataclass
class RunStart(Generic[DataT]):
    """What `setup_run` built; ``data`` is the second item ``build_data`` returned, ``services`` what ``after_ray``
    returned."""

    log_dir: Path
    logger: Logger
    dataloader: StatefulPromptLoader
    data: DataT
    checkpointer: CheckpointManager
    state: RunState
    weights_path: str | None
    optimizer_path: str | None
    services: Any = None


def setup_run(
    config: Any,
    seed: int,
    tokenizer: Any,
    build_data: Callable[[], tuple[StatefulPromptLoader, DataT]],
    after_ray: Callable[[], Any] | None = None,
    log_dir_as_given: bool = False,
) -> RunStart[DataT]:
    """The shared start of a run of ``config`` (its ``logger``, ``checkpointing`` and ``policy`` sections).
    ``build_data`` gives the training loader (and whatever else the algorithm loads with it); ``after_ray`` starts
    what needs Ray (environments) before the checkpoint restores the RNG states. A checkpoint of another model fails
    before Ray starts. The run logs into a new ``exp_N`` under ``logger.log_dir``, or into ``logger.log_dir`` itself
    with ``log_dir_as_given`` (NeMo-RL's scripts choose the ``exp_N`` before setup)."""
    from nemo_rl_clone.distributed.virtual_cluster import init_ray
    from nemo_rl_clone.models.policy.backends import policy_backend

    set_seeds(seed)
    if log_dir_as_given:
        log_dir = Path(config.logger.log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
    else:
        log_dir = get_next_experiment_dir(config.logger.log_dir)
    resolved = config_to_dict(config)
    save_config(resolved, log_dir / "config.yaml")
    run_logger = Logger(config.logger, log_dir)
    run_logger.log_hyperparams(resolved)
    dataloader, data = build_data()
    checkpointer = CheckpointManager(config.checkpointing, lock=config.checkpointing.enabled)
    model = model_identity(config.policy.model_name, tokenizer, policy_backend(config.policy))
    check_checkpoint_model(checkpointer, model)
    init_ray(log_dir=str(log_dir))
    services = after_ray() if after_ray is not None else None
    state, weights_path, optimizer_path = restore_run_state(checkpointer, dataloader, model)
    return RunStart(log_dir, run_logger, dataloader, data, checkpointer, state, weights_path, optimizer_path, services)


def give_megatron_its_steps(policy: Any, loop: Any, batches_per_epoch: int, train_calls_per_step: int = 1) -> None:
    """As NeMo-RL's algorithms do, a Megatron policy learns the run's optimizer-step count as
    ``megatron_cfg.train_iters`` (the length of its weight-decay ramp, and of its LR decay where
    ``scheduler.lr_decay_iters`` is null): ``min(max_num_steps, max_num_epochs × batches per epoch)`` steps of
    ``train_calls_per_step`` `train` calls each. A value the config gives is kept (NeMo-RL overwrites it)."""
    megatron = getattr(policy, "megatron_cfg", None)
    if megatron is None or not megatron.enabled or megatron.train_iters is not None:
        return
    max_steps = math.inf if loop.max_num_steps == -1 else loop.max_num_steps  # SFT's -1: no limit
    megatron.train_iters = int(min(max_steps, loop.max_num_epochs * batches_per_epoch)) * train_calls_per_step


def ray_cluster(
    cluster: Any,
    name: str,
    use_gpus: bool,
    gpus_per_node: int,
    num_nodes: int,
    max_colocated_worker_groups: int = 1,
    placement: SegmentPlacement | None = None,
    role: str = "training",
    nodes_key: str = "cluster.num_nodes",
    collective_timeout_s: float | None = None,
) -> RayVirtualCluster:
    """A `RayVirtualCluster` of ``num_nodes`` bundles of ``gpus_per_node``, on the ports of the run's ``cluster``
    section and, with ``cluster.segment_size``, on whole NVLink-domain segments. Every cluster a run builds from its
    ``cluster`` section is made here. A run with several clusters passes them one ``placement``, so that each takes
    its segments from the nodes the earlier ones left; ``role`` and ``nodes_key`` (the key of ``num_nodes``) name the
    cluster in its messages; ``collective_timeout_s`` is the run's ``watchdog.collective_timeout_s``."""
    from nemo_rl_clone.distributed.segment_topology import SegmentPlacement
    from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster, init_ray

    init_ray()  # the placement reads the nodes' topology
    if placement is None:
        placement = SegmentPlacement(cluster.segment_size)
    return RayVirtualCluster(
        [gpus_per_node] * num_nodes,
        use_gpus=use_gpus,
        max_colocated_worker_groups=max_colocated_worker_groups,
        num_gpus_per_node=gpus_per_node,
        name=name,
        port_range_low=cluster.master_port_range_low,
        port_range_high=cluster.master_port_range_high,
        segment_size=cluster.segment_size,
        node_resource_constraints=placement.take(num_nodes, role, nodes_key),
        collective_timeout_s=collective_timeout_s,
    )
