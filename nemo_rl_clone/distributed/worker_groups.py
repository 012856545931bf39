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
from typing import Any, cast

import numpy as np
import ray
from ray.actor import ActorClass, ActorHandle
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from nemo_rl_clone.distributed.named_sharding import NamedSharding
from nemo_rl_clone.distributed.ports import port_was_taken
from nemo_rl_clone.distributed.ray_actor_environment import get_actor_python_executable
from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl_clone.distributed.worker_group_dispatch import (
    MultiWorkerFuture,
    ShardedDispatchPlan,
    WatchedMethod,
    actor_pid,
    check_nesting,
    get_fail_fast,
    piece_at,
    plan_sharded_call,
    plan_sharded_dispatch,
)
from nemo_rl_clone.distributed.worker_placement import (
    WorkerMetadata,
    assign_ranks,
    check_extra_env_vars,
    checked_sharding,
    collective_timeout_env,
    dp_leaders,
    select_slots,
    worker_env,
)
from nemo_rl_clone.utils import watchdog
from nemo_rl_clone.utils.imports import import_by_path

logger = logging.getLogger(__name__)

_READY_LOG_INTERVAL_S = 60.0
# How long `shutdown` waits for each killed actor to be gone before warning.
_KILL_WAIT_S = 60.0
# Starts of a group whose rendezvous port was bound by someone else between the cluster's probe and rank 0's listen.
_PORT_ATTEMPTS = 3


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


# The cleanup time `Policy` and `VllmGeneration` give their workers at shutdown (freeing GPU memory, stopping the
# engines); RayWorkerGroup.shutdown's own default is NeMo-RL's 30 s.
MODEL_WORKER_CLEANUP_TIMEOUT_S = 60.0


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
        **extra_options: Any,
    ) -> ActorHandle:
        """Start one actor in bundle ``bundle_index`` of ``placement_group`` (returns at once; see `__ray_ready__`).

        ``extra_options`` are more Ray actor options; they override ``ray_actor_options``. A ``runtime_env`` among
        them is merged with the worker's (its ``env_vars`` under ``env_vars``).
        """
        extra_env = dict(extra_options.pop("runtime_env", None) or {})
        runtime_env: dict[str, Any] = {**extra_env, "env_vars": {**extra_env.get("env_vars", {}), **env_vars}}
        python = get_actor_python_executable(self.ray_actor_class_fqn)
        if python != sys.executable:
            runtime_env["py_executable"] = python
        options: dict[str, Any] = {
            **self.ray_actor_options,
            **extra_options,
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

    def __call__(
        self,
        placement_group: PlacementGroup,
        placement_group_bundle_index: int,
        num_gpus: float,
        bundle_indices: tuple[int, list[int]] | None = None,
        **extra_options: Any,
    ) -> ActorHandle:
        """NeMo-RL's form of `create_worker`: ``extra_options`` are Ray actor options (``num_cpus`` defaults to 1).

        ``bundle_indices`` (NeMo-RL's tied multi-bundle workers, handed to a ``configure_worker`` hook) must be None:
        every worker here owns exactly one bundle.
        """
        if bundle_indices is not None:
            raise NotImplementedError(
                f"not supported yet: bundle_indices={bundle_indices!r} (tied workers spanning several bundles); "
                "start one worker per bundle"
            )
        extra_env = dict(extra_options.pop("runtime_env", None) or {})
        env_vars = dict(extra_env.pop("env_vars", None) or {})
        return self.create_worker(
            placement_group,
            placement_group_bundle_index,
            num_cpus=extra_options.pop("num_cpus", 1),
            num_gpus=num_gpus,
            env_vars=env_vars,
            name=extra_options.pop("name", None),
            runtime_env=extra_env,
            **extra_options,
        )


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
        sharding_annotations: how ranks map to named axes (its layout must hold every rank ``0 .. N-1``); default
            one ``"data_parallel"`` axis over all ranks.
        env_vars: extra environment for every worker (may not set the distributed variables).
        dp_leader_worker_indices: the rank that owns each data-parallel shard, ascending; default: the ranks at
            coordinate 0 on every axis but ``"data_parallel"`` (see `get_dp_leader_worker_idx`).
        wait: return only when every actor's constructor has finished, raising (after killing the group) if one
            failed; False returns at once and leaves that to `wait_until_constructed`.
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
        dp_leader_worker_indices: list[int] | None = None,
        wait: bool = True,
    ) -> None:
        self.cluster = cluster
        self.builder = remote_worker_builder
        self.name_prefix = name_prefix
        self.name = name_prefix or remote_worker_builder.class_name
        check_extra_env_vars(env_vars)
        slots = select_slots(cluster, workers_per_node, bundle_indices_list)
        self.sharding_annotations = checked_sharding(sharding_annotations, len(slots), self.name)
        self.dp_leader_worker_indices = dp_leaders(self.sharding_annotations, dp_leader_worker_indices)
        self.worker_metadata: list[WorkerMetadata] = assign_ranks(slots)
        # every worker's extra environment, the cluster's collective timeout included: given again on a restart
        self._env_vars = {**(env_vars or {}), **collective_timeout_env(cluster.collective_timeout_s)}
        self.master_address, self.master_port = self._new_rendezvous_port()
        self._pids: list[int] | None = None
        self._workers: list[ActorHandle] = self._start_workers(self._env_vars)
        if wait:
            self.wait_until_constructed()

    def _new_rendezvous_port(self) -> tuple[str, int]:
        first = self.worker_metadata[0]  # rank 0 listens
        return self.cluster.get_master_address_and_port(first.placement_group_index, first.bundle_index)

    def _start_workers(self, env_vars: dict[str, str]) -> list[ActorHandle]:
        """One actor per rank in its bundle (returns at once; `wait_until_constructed` waits for them)."""
        resources = self.cluster.resources_per_worker()
        placement_groups = self.cluster.get_placement_groups()
        return [
            self.builder.create_worker(
                placement_groups[meta.placement_group_index],
                meta.bundle_index,
                num_cpus=resources["num_cpus"],
                num_gpus=resources["num_gpus"],
                env_vars=worker_env(meta, self.world_size, self.master_address, self.master_port, env_vars),
                name=f"{self.name_prefix}-{meta.rank}" if self.name_prefix else None,
            )
            for meta in self.worker_metadata
        ]

    @property
    def workers(self) -> list[ActorHandle]:
        return list(self._workers)

    @property
    def world_size(self) -> int:
        return len(self.worker_metadata)

    @property
    def dp_size(self) -> int:
        """Number of data-parallel shards: by default the size of the ``data_parallel`` axis (1 when the group has
        none), else the number of ``dp_leader_worker_indices`` given."""
        return len(self.dp_leader_worker_indices)

    def get_dp_leader_worker_idx(self, dp_shard_idx: int) -> int:
        """The rank that owns data-parallel shard ``dp_shard_idx`` (IndexError outside the shards)."""
        if not 0 <= dp_shard_idx < len(self.dp_leader_worker_indices):
            raise IndexError(
                f"dp_shard_idx {dp_shard_idx} is outside worker group {self.name!r}'s "
                f"{len(self.dp_leader_worker_indices)} data-parallel shards"
            )
        return self.dp_leader_worker_indices[dp_shard_idx]

    def run_single_worker_single_data(
        self, method_name: str, worker_idx: int, *args: Any, **kwargs: Any
    ) -> ray.ObjectRef:
        """Call ``method_name(*args, **kwargs)`` on worker ``worker_idx`` (its rank)."""
        if not 0 <= worker_idx < len(self._workers):
            raise IndexError(f"worker_idx {worker_idx} is outside worker group {self.name!r} (size {self.world_size})")
        return self._method(worker_idx, method_name).remote(*args, **kwargs)

    def run_all_workers_single_data(
        self, method_name: str, *args: Any, run_rank_0_only_axes: Sequence[str] | None = None, **kwargs: Any
    ) -> list[ray.ObjectRef]:
        """Call ``method_name(*args, **kwargs)`` on every worker; refs in rank order.

        ``run_rank_0_only_axes``: call only the workers at coordinate 0 on these axes.
        """
        ranks = self._ranks_at_zero(run_rank_0_only_axes)
        return [self._method(rank, method_name).remote(*args, **kwargs) for rank in ranks]

    def run_all_workers_multiple_data(
        self,
        method_name: str,
        *args: Sequence[Any],
        run_rank_0_only_axes: Sequence[str] | None = None,
        common_kwargs: dict[str, Any] | None = None,
        **kwargs: Sequence[Any],
    ) -> list[ray.ObjectRef]:
        """Call worker ``i`` with the ``i``-th entry of every argument: ``method_name(args[0][i], ..., key=kwargs[key][i],
        **common_kwargs)``; refs in rank order.

        ``i`` counts the called workers: all of them, or those at coordinate 0 on ``run_rank_0_only_axes``. Every
        argument must have one entry per called worker.
        """
        self._check_alive()
        ranks = self._ranks_at_zero(run_rank_0_only_axes)
        named = {f"argument {i}": arg for i, arg in enumerate(args)} | {
            f"keyword {key!r}": value for key, value in kwargs.items()
        }
        if not named:
            raise ValueError(
                "run_all_workers_multiple_data needs at least one per-worker argument; use run_all_workers_single_data"
            )
        for label, values in named.items():
            if len(values) != len(ranks):
                raise ValueError(
                    f"data has {len(values)} entries ({label}) but worker group {self.name!r} calls {len(ranks)} workers"
                )
        return [
            self._method(rank, method_name).remote(
                *(arg[i] for arg in args),
                **{key: value[i] for key, value in kwargs.items()},
                **(common_kwargs or {}),
            )
            for i, rank in enumerate(ranks)
        ]

    def run_all_workers_sharded_data(
        self,
        method_name: str,
        *args: Any,
        in_sharded_axes: Sequence[str] | None = None,
        replicate_on_axes: Sequence[str] | None = None,
        output_is_replicated: Sequence[str] | None = None,
        make_dummy_calls_to_free_axes: bool = False,
        common_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> MultiWorkerFuture:
        """Call ``method_name(*pieces, **piece_kwargs, **common_kwargs)`` on each worker with its piece of every
        positional and keyword argument; each is nested by ``in_sharded_axes`` (see `plan_sharded_dispatch` for the
        nesting and which results come back). Dummy calls pass ``None`` for every argument."""
        self._check_alive()
        sharding = self.sharding_annotations
        in_sharded_axes = list(in_sharded_axes or [])
        replicate_on_axes = list(replicate_on_axes or [])
        plan = plan_sharded_call(
            sharding,
            in_sharded_axes,
            replicate_on_axes,
            list(output_is_replicated or []),
            make_dummy_calls_to_free_axes,
        )
        for i, arg in enumerate(args):
            check_nesting(arg, sharding, in_sharded_axes, f"argument {i}" if len(args) > 1 else "data")
        for key, value in kwargs.items():
            check_nesting(value, sharding, in_sharded_axes, key)
        # A piece sent to several replicas is serialized once.
        replicas = int(np.prod([sharding.get_axis_size(axis) for axis in replicate_on_axes]))
        store: dict[tuple[str | int, tuple[int, ...]], Any] = {}

        def piece(name: str | int, data: Any, index: tuple[int, ...] | None) -> Any:
            if index is None:
                return None
            if replicas == 1:
                return piece_at(data, index)
            if (name, index) not in store:
                store[(name, index)] = ray.put(piece_at(data, index))
            return store[(name, index)]

        futures = [
            self._method(rank, method_name).remote(
                *(piece(i, arg, index) for i, arg in enumerate(args)),
                **{key: piece(key, value, index) for key, value in kwargs.items()},
                **(common_kwargs or {}),
            )
            for rank, index in plan.worker_index.items()
        ]
        return MultiWorkerFuture(
            futures,
            plan.return_ranks,
            called_workers=list(plan.worker_index),
            group_name=self.name,
            method_name=method_name,
        )

    def get_all_worker_results(
        self, future_bundle: MultiWorkerFuture, return_generators_as_proxies: bool = False
    ) -> list[Any]:
        return future_bundle.get_results(self, return_generators_as_proxies)

    def shutdown(self, cleanup_method: str | None = None, timeout: float | None = 30.0, force: bool = False) -> bool:
        """Call ``cleanup_method()`` on every worker (unless ``force``; waiting at most ``timeout`` s, None: no limit),
        then kill them; idempotent.

        Returns False if a cleanup call failed or did not finish in time (the workers are killed anyway).
        """
        if not self._workers:
            return True
        if not ray.is_initialized():  # Ray was shut down first: the actors died with it
            self._workers = []
            return cleanup_method is None
        clean = True
        if cleanup_method is not None and not force:
            clean = self._run_cleanup(cleanup_method, timeout)
        for worker in self._workers:
            ray.kill(worker, no_restart=True)
        # ray.kill is asynchronous: wait until the actors are gone so their bundle resources are free for the
        # next group (e.g. an engine restarted on the same colocated bundles).
        for worker in self._workers:
            _wait_until_dead(worker, _KILL_WAIT_S)
        self._workers = []
        return clean

    def _ranks_at_zero(self, axes: Sequence[str] | None) -> list[int]:
        """Ranks at coordinate 0 on every axis of ``axes`` (all ranks for None or [])."""
        for axis in axes or []:
            self.sharding_annotations.get_axis_index(axis)
        return [
            rank
            for rank in range(self.world_size)
            if NamedSharding.is_axis_zero(self.sharding_annotations.get_worker_coords(rank), axes or [])
        ]

    def _run_cleanup(self, cleanup_method: str, timeout_s: float | None) -> bool:
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
            bound = getattr(self._workers[rank], method)
        except AttributeError:
            raise AttributeError(
                f"actor class {self.builder.ray_actor_class_fqn} (worker group {self.name!r}) has no method {method!r}"
            ) from None
        if not watchdog.running():  # nothing to tell: the plain method
            return bound
        name = f"{self.name_prefix}-{rank}" if self.name_prefix else f"{self.name}[{rank}]"
        pid = self._pids[rank] if self._pids else None
        return WatchedMethod(bound, f"{name} (pid {pid}) {method}", pid)

    def wait_until_constructed(self) -> None:
        """Block until every actor's constructor has returned (the constructor does it unless ``wait=False``, which
        lets a caller start another group meanwhile); a failed start shuts the group down and raises.

        A port found free can be bound by another process before rank 0 listens on it (EADDRINUSE): the group is
        then started again on another port, up to ``_PORT_ATTEMPTS`` times in all."""
        label = f"worker group {self.name!r} constructing {self.builder.ray_actor_class_fqn}"
        for attempt in range(_PORT_ATTEMPTS):
            refs: list[ray.ObjectRef] = [worker.__ray_ready__.remote() for worker in self._workers]
            try:
                get_fail_fast(refs, list(range(len(refs))), label, log_pending_every_s=_READY_LOG_INTERVAL_S)
                # for the watchdog, which names a stalled worker by its pid (a stalled actor cannot be asked then)
                self._pids = ray.get([worker.__ray_call__.remote(actor_pid) for worker in self._workers])
                return
            except ray.exceptions.RayError as error:
                self.shutdown()
                if not port_was_taken(error) or attempt + 1 == _PORT_ATTEMPTS:
                    raise RuntimeError(f"{label}: an actor failed to start (see the cause below)") from error
                taken, (self.master_address, self.master_port) = self.master_port, self._new_rendezvous_port()
                note = "was taken before rank 0 could listen on it; starting again on port"
                logger.warning("%s: rendezvous port %d %s %d", label, taken, note, self.master_port)
                self._workers = self._start_workers(self._env_vars)


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


__all__ = [
    "MultiWorkerFuture",
    "RayWorkerBuilder",
    "RayWorkerGroup",
    "ShardedDispatchPlan",
    "WorkerMetadata",
    "import_class",
    "plan_sharded_dispatch",
]
