"""A group of Ray actors, one per cluster bundle, wired for torch.distributed, with data dispatch helpers.

Each worker gets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` and ``NODE_RANK`` in its
environment, so ``torch.distributed.init_process_group()`` works unchanged inside it. Data is handed out by rank
(`run_all_workers_multiple_data`) or by the group's `NamedSharding` (`run_all_workers_sharded_data`): pieces are
indexed by the coordinates of the sharded axes, replicated along the others, and only one copy of a replicated
output is returned.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import ray
from ray.actor import ActorClass, ActorHandle
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from nemo_rl_clone.distributed.named_sharding import NamedSharding
from nemo_rl_clone.distributed.ray_actor_environment import get_actor_python_executable
from nemo_rl_clone.distributed.virtual_cluster import BundleSlot, RayVirtualCluster
from nemo_rl_clone.utils.imports import import_by_path

logger = logging.getLogger(__name__)

DISTRIBUTED_ENV_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK")
_READY_LOG_INTERVAL_S = 60.0


def import_class(fqn: str) -> type:
    """The class (or ``@ray.remote`` actor class) at dotted path ``"pkg.module.Class"``."""
    try:
        return import_by_path(fqn)
    except ImportError as error:
        error.add_note(
            f"while importing actor class {fqn} in the driver: worker modules must import heavy or "
            "environment-specific packages inside methods so that the driver can import the class"
        )
        raise


class RayWorkerBuilder:
    """Creates actors of the class at ``ray_actor_class_fqn`` with constructor ``*args, **kwargs``.

    The class is imported on first use, not when the builder is made. It may be a plain class or already decorated
    with ``@ray.remote(...)`` (its options, e.g. ``max_concurrency``, are kept); ``ray_actor_options`` add to them. The actor runs in the Python
    executable that `ray_actor_environment` registers for the class.
    """

    def __init__(
        self, ray_actor_class_fqn: str, *args: Any, ray_actor_options: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        self.ray_actor_class_fqn = ray_actor_class_fqn
        self.args = args
        self.kwargs = kwargs
        self.ray_actor_options = dict(ray_actor_options or {})  # e.g. {"max_concurrency": 2}

    @property
    def class_name(self) -> str:
        return self.ray_actor_class_fqn.rpartition(".")[2]

    @functools.cached_property
    def actor_class(self) -> ActorClass:
        cls = import_class(self.ray_actor_class_fqn)
        return cls if isinstance(cls, ActorClass) else ray.remote(cls)

    def create_worker(
        self,
        placement_group: PlacementGroup,
        bundle_index: int,
        *,
        num_cpus: float,
        num_gpus: float,
        env_vars: dict[str, str],
        name: str | None = None,
    ) -> ActorHandle:
        """Start one actor in bundle ``bundle_index`` of ``placement_group`` (returns at once; see `__ray_ready__`)."""
        runtime_env: dict[str, Any] = {"env_vars": dict(env_vars)}
        python = get_actor_python_executable(self.ray_actor_class_fqn)
        if python != sys.executable:
            runtime_env["py_executable"] = python
        options: dict[str, Any] = {
            **self.ray_actor_options,
            "num_cpus": num_cpus,
            "num_gpus": num_gpus,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group, placement_group_bundle_index=bundle_index
            ),
            "runtime_env": runtime_env,
        }
        if name:
            options["name"] = name
        return cast(ActorHandle, self.actor_class.options(**options).remote(*self.args, **self.kwargs))


@dataclass(frozen=True)
class WorkerMetadata:
    """Where worker ``rank`` runs. ``node_rank`` counts the group's nodes densely from 0."""

    rank: int
    node_rank: int
    local_rank: int
    placement_group_index: int
    bundle_index: int


@dataclass(frozen=True)
class ShardedDispatchPlan:
    """``worker_data``: rank → its data piece (None for dummy calls), only for the ranks to call, in rank order;
    ``return_ranks``: ranks whose results are returned, in rank order."""

    worker_data: dict[int, Any]
    return_ranks: list[int]


def plan_sharded_dispatch(
    sharding: NamedSharding,
    data: Any,
    in_sharded_axes: Sequence[str],
    replicate_on_axes: Sequence[str],
    output_is_replicated: Sequence[str],
    make_dummy_calls_to_free_axes: bool = False,
) -> ShardedDispatchPlan:
    """Decide which rank gets which piece of ``data``.

    ``data`` is nested, one level per entry of ``in_sharded_axes`` (in that order): ``data[i][j]`` goes to every rank
    whose coordinate on ``in_sharded_axes[0]`` is ``i`` and on ``in_sharded_axes[1]`` is ``j``, whatever its coordinates
    on ``replicate_on_axes``. Axes in neither list are *free*: only ranks at coordinate 0 on them are called (the
    others get ``None`` if ``make_dummy_calls_to_free_axes``, for methods containing collectives). Results are
    returned from ranks at coordinate 0 on every free axis and every axis in ``output_is_replicated``.
    """
    names = sharding.names
    for argument, axes in (
        ("in_sharded_axes", in_sharded_axes),
        ("replicate_on_axes", replicate_on_axes),
        ("output_is_replicated", output_is_replicated),
    ):
        unknown = [axis for axis in axes if axis not in names]
        if unknown:
            raise ValueError(f"{argument} names unknown axes {unknown}; the worker group's axes are {names}")
    both = sorted(set(in_sharded_axes) & set(replicate_on_axes))
    if both:
        raise ValueError(f"axes {both} are in both in_sharded_axes and replicate_on_axes; an axis is one or the other")
    _check_nesting(data, [(axis, sharding.get_axis_size(axis)) for axis in in_sharded_axes], [])

    free_axes = [axis for axis in names if axis not in in_sharded_axes and axis not in replicate_on_axes]
    worker_data: dict[int, Any] = {}
    return_ranks: list[int] = []
    for rank in range(sharding.size):
        coords = sharding.get_worker_coords(rank)
        on_free_origin = all(coords[axis] == 0 for axis in free_axes)
        if on_free_origin:
            piece = data
            for axis in in_sharded_axes:
                piece = piece[coords[axis]]
            worker_data[rank] = piece
            if all(coords[axis] == 0 for axis in output_is_replicated):
                return_ranks.append(rank)
        elif make_dummy_calls_to_free_axes:
            worker_data[rank] = None
    return ShardedDispatchPlan(worker_data=worker_data, return_ranks=return_ranks)


def _check_nesting(data: Any, levels: list[tuple[str, int]], index: list[int]) -> None:
    if not levels:
        return
    axis, size = levels[0]
    where = "data" + "".join(f"[{i}]" for i in index)
    if not isinstance(data, (list, tuple)):
        raise ValueError(
            f"{where} must be a list of {size} pieces for axis {axis!r} (data is nested by in_sharded_axes), "
            f"got {type(data).__name__}"
        )
    if len(data) != size:
        raise ValueError(f"{where} has {len(data)} pieces but axis {axis!r} has size {size}")
    for i, piece in enumerate(data):
        _check_nesting(piece, levels[1:], [*index, i])


class MultiWorkerFuture:
    """Pending results of one call on several workers.

    Args:
        futures: one ObjectRef per called worker.
        return_from_workers: ranks whose results `get_results` returns (default: all called workers).
        worker_ranks: the rank of each future (default ``0 .. len(futures) - 1``).
        group_name, method_name: for error messages.
    """

    def __init__(
        self,
        futures: list[ray.ObjectRef],
        return_from_workers: list[int] | None = None,
        worker_ranks: list[int] | None = None,
        group_name: str = "",
        method_name: str = "",
    ) -> None:
        self.futures = list(futures)
        self.worker_ranks = list(worker_ranks) if worker_ranks is not None else list(range(len(self.futures)))
        if len(self.worker_ranks) != len(self.futures):
            raise ValueError(f"got {len(self.futures)} futures but {len(self.worker_ranks)} worker ranks")
        self.return_from_workers = (
            sorted(return_from_workers) if return_from_workers is not None else sorted(self.worker_ranks)
        )
        missing = sorted(set(self.return_from_workers) - set(self.worker_ranks))
        if missing:
            raise ValueError(f"return_from_workers {missing} were not called (called ranks: {self.worker_ranks})")
        self.group_name = group_name
        self.method_name = method_name

    def get_results(self, worker_group: RayWorkerGroup | None = None) -> list[Any]:
        """Block until every called worker is done; results of ``return_from_workers`` in rank order.

        A failure of any worker is raised as soon as it happens (not after the workers before it in rank order,
        which may be blocked in a collective waiting for the failed one), with a note naming its rank.
        ``worker_group``, if given, must be the group that made this future.
        """
        if worker_group is not None and worker_group.name != self.group_name:
            raise ValueError(f"this future comes from worker group {self.group_name!r}, not {worker_group.name!r}")
        results = _get_fail_fast(self.futures, self.worker_ranks, f"{self.group_name}.{self.method_name}")
        by_rank = dict(zip(self.worker_ranks, results, strict=True))
        return [by_rank[rank] for rank in self.return_from_workers]


def _get_fail_fast(
    refs: list[ray.ObjectRef], ranks: list[int], label: str, log_pending_every_s: float | None = None
) -> list[Any]:
    """``ray.get`` of every ref, raising the first failure as soon as it happens (noted with the worker's rank).

    With ``log_pending_every_s``, logs the ranks still pending each time that long passes without progress.
    """
    position = {ref: i for i, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=log_pending_every_s)
        if not ready:
            waiting = sorted(ranks[position[ref]] for ref in pending)
            logger.warning("%s: workers %s still pending; available: %s", label, waiting, ray.available_resources())
        for ref in ready:
            try:
                results[position[ref]] = ray.get(ref)
            except ray.exceptions.RayError as error:
                error.add_note(f"raised by worker rank {ranks[position[ref]]} in {label}")
                raise
    return results


class RayWorkerGroup:
    """Actors built by ``remote_worker_builder``, one per selected bundle of ``cluster``; rank order = slot order.

    Args:
        cluster: the reserved bundles.
        remote_worker_builder: makes each actor.
        workers_per_node: use only the first N bundles of each node (an int for all nodes or a list per node);
            default: every bundle.
        name_prefix: actors are named ``{name_prefix}-{rank}``; also the group's name in messages.
        bundle_indices_list: explicit bundles as ``[(placement_group_index, [bundle_index, ...]), ...]``, one worker
            per listed bundle, ranks in listed order. Exclusive with ``workers_per_node``.
        sharding_annotations: how ranks map to named axes; default one ``"data_parallel"`` axis over all ranks.
        env_vars: extra environment for every worker (may not set the distributed variables).

    The constructor returns when every actor's constructor has finished, and raises (after killing the group) if
    one failed.
    """

    def __init__(
        self,
        cluster: RayVirtualCluster,
        remote_worker_builder: RayWorkerBuilder,
        workers_per_node: int | list[int] | None = None,
        name_prefix: str = "",
        bundle_indices_list: list[tuple[int, list[int]]] | None = None,
        sharding_annotations: NamedSharding | None = None,
        env_vars: dict[str, str] | None = None,
    ) -> None:
        self.cluster = cluster
        self.builder = remote_worker_builder
        self.name = name_prefix or remote_worker_builder.class_name
        reserved = sorted(set(env_vars or {}) & set(DISTRIBUTED_ENV_VARS))
        if reserved:
            raise ValueError(f"env_vars may not set {reserved}: RayWorkerGroup sets them for each worker")

        slots = _select_slots(cluster, workers_per_node, bundle_indices_list)
        world_size = len(slots)
        if sharding_annotations is None:
            sharding_annotations = NamedSharding(np.arange(world_size), ["data_parallel"])
        if sharding_annotations.size != world_size:
            raise ValueError(
                f"sharding_annotations covers {sharding_annotations.size} ranks but worker group {self.name!r} has "
                f"{world_size} workers"
            )
        self.sharding_annotations = sharding_annotations
        self.worker_metadata = _assign_ranks(slots)

        master_addr, master_port = cluster.get_master_address_and_port(
            slots[0].placement_group_index, slots[0].bundle_index
        )
        resources = cluster.resources_per_worker()
        placement_groups = cluster.get_placement_groups()
        self._workers: list[ActorHandle] = []
        for meta in self.worker_metadata:
            worker_env = {
                **(env_vars or {}),
                "RANK": str(meta.rank),
                "LOCAL_RANK": str(meta.local_rank),
                "WORLD_SIZE": str(world_size),
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
                "NODE_RANK": str(meta.node_rank),
            }
            self._workers.append(
                remote_worker_builder.create_worker(
                    placement_groups[meta.placement_group_index],
                    meta.bundle_index,
                    num_cpus=resources["num_cpus"],
                    num_gpus=resources["num_gpus"],
                    env_vars=worker_env,
                    name=f"{name_prefix}-{meta.rank}" if name_prefix else None,
                )
            )
        self._wait_until_constructed()

    @property
    def workers(self) -> list[ActorHandle]:
        return list(self._workers)

    @property
    def world_size(self) -> int:
        return len(self.worker_metadata)

    @property
    def dp_size(self) -> int:
        """Size of the ``data_parallel`` axis (1 when the group has none)."""
        if "data_parallel" not in self.sharding_annotations.names:
            return 1
        return self.sharding_annotations.get_axis_size("data_parallel")

    def run_single_worker_single_data(self, method: str, worker_idx: int, *args: Any, **kwargs: Any) -> ray.ObjectRef:
        """Call ``method(*args, **kwargs)`` on worker ``worker_idx`` (its rank)."""
        if not 0 <= worker_idx < len(self._workers):
            raise IndexError(f"worker_idx {worker_idx} is outside worker group {self.name!r} (size {self.world_size})")
        return self._method(worker_idx, method).remote(*args, **kwargs)

    def run_all_workers_single_data(self, method: str, *args: Any, **kwargs: Any) -> list[ray.ObjectRef]:
        """Call ``method(*args, **kwargs)`` on every worker; refs in rank order."""
        return [self._method(rank, method).remote(*args, **kwargs) for rank in range(self.world_size)]

    def run_all_workers_multiple_data(
        self, method: str, data: Sequence[Any], common_kwargs: dict[str, Any] | None = None
    ) -> list[ray.ObjectRef]:
        """Call ``method(data[rank], **common_kwargs)`` on every worker; refs in rank order."""
        self._check_alive()
        if len(data) != self.world_size:
            raise ValueError(
                f"data has {len(data)} entries but worker group {self.name!r} has {self.world_size} workers"
            )
        return [
            self._method(rank, method).remote(data[rank], **(common_kwargs or {})) for rank in range(self.world_size)
        ]

    def run_all_workers_sharded_data(
        self,
        method: str,
        data: Any,
        in_sharded_axes: Sequence[str],
        replicate_on_axes: Sequence[str],
        output_is_replicated: Sequence[str],
        common_kwargs: dict[str, Any] | None = None,
        make_dummy_calls_to_free_axes: bool = False,
    ) -> MultiWorkerFuture:
        """Call ``method(piece, **common_kwargs)`` on each worker with its piece of ``data`` (see
        `plan_sharded_dispatch` for the nesting and which results come back)."""
        self._check_alive()
        plan = plan_sharded_dispatch(
            self.sharding_annotations,
            data,
            in_sharded_axes,
            replicate_on_axes,
            output_is_replicated,
            make_dummy_calls_to_free_axes,
        )
        ranks = list(plan.worker_data)
        futures = [self._method(rank, method).remote(plan.worker_data[rank], **(common_kwargs or {})) for rank in ranks]
        return MultiWorkerFuture(
            futures, plan.return_ranks, worker_ranks=ranks, group_name=self.name, method_name=method
        )

    def get_all_worker_results(self, future: MultiWorkerFuture) -> list[Any]:
        return future.get_results(self)

    def shutdown(self, cleanup_method: str | None = None, timeout_s: float = 60.0) -> bool:
        """Call ``cleanup_method()`` on every worker (waiting at most ``timeout_s``), then kill them; idempotent.

        Returns False if a cleanup call failed or did not finish in time (the workers are killed anyway).
        """
        if not self._workers:
            return True
        if not ray.is_initialized():  # Ray was shut down first: the actors died with it
            self._workers = []
            return cleanup_method is None
        clean = True
        if cleanup_method is not None:
            clean = self._run_cleanup(cleanup_method, timeout_s)
        for worker in self._workers:
            ray.kill(worker, no_restart=True)
        # ray.kill is asynchronous: wait until the actors are gone so their bundle resources are free for the
        # next group (e.g. an engine restarted on the same colocated bundles).
        for worker in self._workers:
            _wait_until_dead(worker, timeout_s)
        self._workers = []
        return clean

    def _run_cleanup(self, cleanup_method: str, timeout_s: float) -> bool:
        try:
            refs = [self._method(rank, cleanup_method).remote() for rank in range(self.world_size)]
        except AttributeError as error:
            logger.warning("%s: no cleanup: %s", self.name, error)
            return False
        done, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        clean = not pending
        if pending:
            logger.warning(
                "%s: %d workers did not finish %s within %s s", self.name, len(pending), cleanup_method, timeout_s
            )
        for ref in done:
            try:
                ray.get(ref)
            except ray.exceptions.RayError as error:
                clean = False
                logger.warning("%s: %s failed on a worker: %s", self.name, cleanup_method, error)
        return clean

    def _check_alive(self) -> None:
        if not self._workers:
            raise RuntimeError(f"worker group {self.name!r} was shut down")

    def _method(self, rank: int, method: str) -> Any:
        self._check_alive()
        try:
            return getattr(self._workers[rank], method)
        except AttributeError:
            raise AttributeError(
                f"actor class {self.builder.ray_actor_class_fqn} (worker group {self.name!r}) has no method {method!r}"
            ) from None

    def _wait_until_constructed(self) -> None:
        refs: list[ray.ObjectRef] = [worker.__ray_ready__.remote() for worker in self._workers]
        label = f"worker group {self.name!r} constructing {self.builder.ray_actor_class_fqn}"
        try:
            _get_fail_fast(refs, list(range(len(refs))), label, log_pending_every_s=_READY_LOG_INTERVAL_S)
        except ray.exceptions.RayError as error:
            self.shutdown()
            raise RuntimeError(f"{label}: an actor failed to start (see the cause below)") from error


def _select_slots(
    cluster: RayVirtualCluster,
    workers_per_node: int | list[int] | None,
    bundle_indices_list: list[tuple[int, list[int]]] | None,
) -> list[BundleSlot]:
    slots = cluster.get_bundle_slots()
    if bundle_indices_list is not None:
        if workers_per_node is not None:
            raise ValueError("give workers_per_node or bundle_indices_list, not both")
        by_key = {(slot.placement_group_index, slot.bundle_index): slot for slot in slots}
        selected = []
        for pg_index, bundle_indices in bundle_indices_list:
            for bundle_index in bundle_indices:
                if (pg_index, bundle_index) not in by_key:
                    raise ValueError(
                        f"bundle_indices_list names placement group {pg_index}, bundle {bundle_index}, which the "
                        f"cluster does not have (bundles per placement group: {cluster.bundle_ct_per_node_list})"
                    )
                selected.append(by_key[(pg_index, bundle_index)])
        if len(set(selected)) != len(selected):
            raise ValueError(f"bundle_indices_list names a bundle twice: {bundle_indices_list}")
        if not selected:
            raise ValueError("bundle_indices_list selects no bundle")
        return selected
    if workers_per_node is None:
        return slots
    node_ranks = sorted({slot.node_rank for slot in slots})
    counts = [workers_per_node] * len(node_ranks) if isinstance(workers_per_node, int) else list(workers_per_node)
    if len(counts) != len(node_ranks):
        raise ValueError(f"workers_per_node has {len(counts)} entries but the cluster has {len(node_ranks)} nodes")
    selected = []
    for node_rank, count in zip(node_ranks, counts, strict=True):
        on_node = [slot for slot in slots if slot.node_rank == node_rank]
        if not 0 <= count <= len(on_node):
            raise ValueError(
                f"workers_per_node asks for {count} workers on node {node_rank}, which has {len(on_node)} bundles"
            )
        selected += on_node[:count]
    if not selected:
        raise ValueError(f"workers_per_node={workers_per_node} selects no bundle")
    return selected


def _assign_ranks(slots: list[BundleSlot]) -> list[WorkerMetadata]:
    node_ranks: dict[int, int] = {}
    local_counts: dict[int, int] = {}
    metadata = []
    for rank, slot in enumerate(slots):
        node_rank = node_ranks.setdefault(slot.node_rank, len(node_ranks))
        local_rank = local_counts.get(node_rank, 0)
        local_counts[node_rank] = local_rank + 1
        metadata.append(WorkerMetadata(rank, node_rank, local_rank, slot.placement_group_index, slot.bundle_index))
    return metadata


def _wait_until_dead(actor: Any, timeout_s: float) -> None:
    """Block until calls to a killed actor fail (it is dead), or warn after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=max(0.1, deadline - time.monotonic()))
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return
        time.sleep(0.05)
    logger.warning("actor %s still answers %.0f s after ray.kill", actor, timeout_s)
