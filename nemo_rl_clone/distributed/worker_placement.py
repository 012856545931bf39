"""Where each worker of a `RayWorkerGroup` runs: its bundle, its ranks and the distributed environment it is given.

Pure functions of the cluster's bundle slots and the group's arguments (no Ray calls), so `worker_groups` only
starts and calls actors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import numpy as np

from nemo_rl_clone.distributed.named_sharding import NamedSharding
from nemo_rl_clone.distributed.virtual_cluster import BundleSlot, RayVirtualCluster

DISTRIBUTED_ENV_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK")
# The cluster's collective timeout (``watchdog.collective_timeout_s``), for the process groups a worker makes.
COLLECTIVE_TIMEOUT_ENV = "NRL_COLLECTIVE_TIMEOUT_S"


def collective_timeout() -> timedelta | None:
    """This worker's process-group timeout (`COLLECTIVE_TIMEOUT_ENV`); None: torch's default."""
    value = os.environ.get(COLLECTIVE_TIMEOUT_ENV)
    return timedelta(seconds=float(value)) if value else None


@dataclass(frozen=True)
class WorkerMetadata:
    """Where worker ``rank`` runs. ``node_rank`` counts the group's nodes densely from 0."""

    rank: int
    node_rank: int
    local_rank: int
    placement_group_index: int
    bundle_index: int


def check_extra_env_vars(env_vars: dict[str, str] | None) -> None:
    """Extra worker environment may not set the variables the group sets per worker."""
    reserved = sorted(set(env_vars or {}) & set(DISTRIBUTED_ENV_VARS))
    if reserved:
        raise ValueError(f"env_vars may not set {reserved}: RayWorkerGroup sets them for each worker")


def collective_timeout_env(seconds: float | None) -> dict[str, str]:
    """A cluster's collective timeout as a worker's environment (`collective_timeout` reads it); none for None."""
    return {} if seconds is None else {COLLECTIVE_TIMEOUT_ENV: str(seconds)}


def worker_env(
    meta: WorkerMetadata, world_size: int, master_addr: str, master_port: int, env_vars: dict[str, str] | None
) -> dict[str, str]:
    """``env_vars`` plus the torch.distributed variables of worker ``meta``."""
    return {
        **(env_vars or {}),
        "RANK": str(meta.rank),
        "LOCAL_RANK": str(meta.local_rank),
        "WORLD_SIZE": str(world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "NODE_RANK": str(meta.node_rank),
    }


def checked_sharding(sharding: NamedSharding | None, world_size: int, group_name: str) -> NamedSharding:
    """``sharding`` (default: one ``"data_parallel"`` axis over all ranks), checked to hold every rank once."""
    if sharding is None:
        sharding = NamedSharding(np.arange(world_size), ["data_parallel"])
    ranks = sorted(sharding.layout.reshape(-1).tolist())
    if ranks != list(range(world_size)):
        raise ValueError(
            f"sharding_annotations must hold every rank 0..{world_size - 1} of worker group {group_name!r} "
            f"({world_size} workers) exactly once, got ranks {ranks}"
        )
    return sharding


def select_slots(
    cluster: RayVirtualCluster,
    workers_per_node: int | list[int] | None,
    bundle_indices_list: list[tuple[int, list[int]]] | None,
) -> list[BundleSlot]:
    """The cluster's bundles the group uses, in rank order (see `RayWorkerGroup`'s arguments)."""
    slots = cluster.get_bundle_slots()
    if bundle_indices_list is not None:
        if workers_per_node is not None:
            raise ValueError("give workers_per_node or bundle_indices_list, not both")
        return _listed_slots(cluster, slots, bundle_indices_list)
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


def _listed_slots(
    cluster: RayVirtualCluster, slots: list[BundleSlot], bundle_indices_list: list[tuple[int, list[int]]]
) -> list[BundleSlot]:
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


def assign_ranks(slots: list[BundleSlot]) -> list[WorkerMetadata]:
    """Rank ``i`` runs in ``slots[i]``; node ranks are dense in order of first appearance."""
    node_ranks: dict[int, int] = {}
    local_counts: dict[int, int] = {}
    metadata = []
    for rank, slot in enumerate(slots):
        node_rank = node_ranks.setdefault(slot.node_rank, len(node_ranks))
        local_rank = local_counts.get(node_rank, 0)
        local_counts[node_rank] = local_rank + 1
        metadata.append(WorkerMetadata(rank, node_rank, local_rank, slot.placement_group_index, slot.bundle_index))
    return metadata


def dp_leaders(sharding: NamedSharding, given: list[int] | None) -> list[int]:
    """The rank owning each data-parallel shard: ``given`` (checked), else the ranks at 0 on every other axis."""
    if given is None:
        others = [axis for axis in sharding.names if axis != "data_parallel"]
        return [
            rank
            for rank in range(sharding.size)
            if NamedSharding.is_axis_zero(sharding.get_worker_coords(rank), others)
        ]
    if list(given) != sorted(set(given)) or not all(0 <= rank < sharding.size for rank in given):
        raise ValueError(
            f"dp_leader_worker_indices must be distinct ascending ranks in 0..{sharding.size - 1}, got {given}"
        )
    return list(given)
