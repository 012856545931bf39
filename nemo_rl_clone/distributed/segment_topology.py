"""Node placement by NVLink domain: ``cluster.segment_size``.

On a rack-scale NVLink system (GB200 NVL72: up to 18 nodes share one NVLink fabric) a model replica whose
model-parallel group spans nodes is only fast when all its nodes are in one NVLink domain. ``ray.sub`` registers two
custom Ray resources on each node it starts: ``nvlink_domain_<ClusterUUID>: 1`` (the fabric's ClusterUUID that
``nvidia-smi -q`` reports; nodes of one rack share it) and ``topo_rank: <n>`` (the node's place in the Slurm
topology, >= 1). Nodes without that information register no domain resource.

With ``segment_size`` set, a cluster of ``num_nodes`` logical nodes is made of ``num_nodes / segment_size``
*segments*, each ``segment_size`` nodes of one domain: domains are visited in order of their lowest topo rank, and
each gives as many whole segments as it holds (never a partial one) until enough are taken. Every logical node is
then pinned to its segment's domain by a tiny amount of the domain resource in each of its bundles
(`RayVirtualCluster`'s ``node_resource_constraints``). A second cluster of the same run (non-colocated generation)
takes its segments from the nodes the first one left (`SegmentPlacement`).

Everything here but `get_ray_cluster_topology` works on a plain topology dict, so it is testable without Ray.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nemo_rl_clone.utils.errors import UserInputError

NVLINK_DOMAIN_PREFIX = "nvlink_domain_"
TOPO_RANK_KEY = "topo_rank"
NVLINK_DOMAIN_UNKNOWN = "unknown"  # a node without a domain resource
TOPO_RANK_UNKNOWN = -1  # a node without a topo_rank resource: sorts first
# Per bundle: a node's domain resource is 1, so up to 1000 bundles of one node fit on it.
DOMAIN_SHARE_PER_BUNDLE = 0.001
SEGMENT_KEY = "cluster.segment_size"

# node id → (domain resource name or NVLINK_DOMAIN_UNKNOWN, topo rank or TOPO_RANK_UNKNOWN)
NodeTopology = dict[str, tuple[str, int]]


class SegmentPlacementError(UserInputError, ValueError):
    """``cluster.segment_size`` cannot be met on this Ray cluster; one line naming the key (``ValueError`` too, as
    NeMo-RL raises for a node count that is not a multiple of the segment size)."""


def node_topology(resources: Mapping[str, float]) -> tuple[str, int]:
    """(domain, topo rank) of one node from its Ray resources."""
    domains = sorted(key for key in resources if key.startswith(NVLINK_DOMAIN_PREFIX))
    rank = resources.get(TOPO_RANK_KEY)
    return (domains[0] if domains else NVLINK_DOMAIN_UNKNOWN, TOPO_RANK_UNKNOWN if rank is None else int(rank))


def topology_from_nodes(nodes: Iterable[Mapping[str, Any]]) -> NodeTopology:
    """The topology of the alive nodes among ``ray.nodes()``-style records (``NodeID``, ``Alive``, ``Resources``)."""
    return {node["NodeID"]: node_topology(node.get("Resources", {})) for node in nodes if node.get("Alive", False)}


def get_ray_cluster_topology() -> NodeTopology:
    """Node id → (NVLink domain, topo rank) of every alive node of the connected Ray cluster."""
    import ray

    return topology_from_nodes(ray.nodes())


def has_domains(topology: Mapping[str, tuple[str, int]]) -> bool:
    return any(domain != NVLINK_DOMAIN_UNKNOWN for domain, _ in topology.values())


def select_segment_nodes(
    topology: Mapping[str, tuple[str, int]], segment_size: int, num_nodes: int
) -> tuple[list[str], list[str]]:
    """``(selected, remaining)`` node ids: ``num_nodes / segment_size`` whole segments of ``segment_size`` nodes of one
    domain each, in topological order, and the other nodes. Nodes without a domain are never selected.

    Raises `SegmentPlacementError` when ``num_nodes`` is not a multiple of ``segment_size`` or the domains do not
    hold enough whole segments."""
    return _select(topology, segment_size, num_nodes, "training", "cluster.num_nodes")


def prepare_segment_topology(
    segment_size: int | None,
    num_nodes: int,
    *,
    topology: Mapping[str, tuple[str, int]] | None = None,
    role: str = "training",
    nodes_key: str = "cluster.num_nodes",
) -> tuple[list[dict[str, float]] | None, list[str], NodeTopology]:
    """``(node_resource_constraints, remaining node ids, topology)`` for a cluster of ``num_nodes`` logical nodes.

    The constraints (one dict per logical node, for `RayVirtualCluster`) are None when ``segment_size`` is None
    (topology then ``{}``, nothing remaining) or when no node reports a domain: one line says so and placement goes
    on without domains. ``topology`` defaults to the connected Ray cluster's; ``role`` and ``nodes_key`` (the config
    key of ``num_nodes``) name the cluster in messages."""
    if segment_size is None:
        return None, [], {}
    known = dict(topology) if topology is not None else get_ray_cluster_topology()
    if not has_domains(known):
        print(_no_domain_line(segment_size), flush=True)
        return None, list(known), known
    selected, remaining = _select(known, segment_size, num_nodes, role, nodes_key)
    return _constraints(known, selected), remaining, known


class SegmentPlacement:
    """Hands out segment-aligned nodes to the clusters of one run, each cluster from the nodes the earlier ones left.

    The topology is read once, at the first `take` (Ray must be connected by then); without any domain information
    the fallback line is printed once and every `take` returns None."""

    def __init__(self, segment_size: int | None, topology: Mapping[str, tuple[str, int]] | None = None) -> None:
        self.segment_size = segment_size
        self._free: NodeTopology | None = dict(topology) if topology is not None else None
        self._without_domains = False

    def take(
        self, num_nodes: int, role: str = "training", nodes_key: str = "cluster.num_nodes"
    ) -> list[dict[str, float]] | None:
        """Constraints pinning each of ``num_nodes`` logical nodes to its segment's domain, or None (no segment_size,
        or no node with a domain); the nodes taken are not offered to a later `take`."""
        if self.segment_size is None or self._without_domains:
            return None
        if self._free is None:
            self._free = get_ray_cluster_topology()
        if not has_domains(self._free):
            self._without_domains = True
            print(_no_domain_line(self.segment_size), flush=True)
            return None
        selected, remaining = _select(self._free, self.segment_size, num_nodes, role, nodes_key)
        constraints = _constraints(self._free, selected)
        self._free = {node: self._free[node] for node in remaining}
        return constraints


def topology_ranks(node_ids: Sequence[str], topology: Mapping[str, tuple[str, int]]) -> list[int]:
    """The rank of each entry of ``node_ids`` (a cluster's logical nodes, by physical node id) when ordered by (its
    domain's lowest topo rank among ``node_ids``, its topo rank); ties keep their order. A node missing from
    ``topology`` counts as one without a domain or rank."""
    placed = [topology.get(node, (NVLINK_DOMAIN_UNKNOWN, TOPO_RANK_UNKNOWN)) for node in node_ids]
    domain_first: dict[str, int] = {}
    for domain, rank in placed:
        domain_first[domain] = min(rank, domain_first.get(domain, rank))
    order = sorted(range(len(placed)), key=lambda i: (domain_first[placed[i][0]], placed[i][1], i))
    ranks = [0] * len(placed)
    for rank, index in enumerate(order):
        ranks[index] = rank
    return ranks


def partial_segments(
    node_ids: Sequence[str], topology: Mapping[str, tuple[str, int]], segment_size: int
) -> dict[str, int]:
    """Domains holding a number of ``node_ids`` (logical nodes) that is not a multiple of ``segment_size``, with that
    number; empty when no node has a domain (nothing to check)."""
    counts: dict[str, int] = {}
    for node in node_ids:
        domain = topology.get(node, (NVLINK_DOMAIN_UNKNOWN, TOPO_RANK_UNKNOWN))[0]
        counts[domain] = counts.get(domain, 0) + 1
    if set(counts) == {NVLINK_DOMAIN_UNKNOWN}:
        return {}
    return {domain: count for domain, count in counts.items() if count % segment_size}


def _select(
    topology: Mapping[str, tuple[str, int]], segment_size: int, num_nodes: int, role: str, nodes_key: str
) -> tuple[list[str], list[str]]:
    if num_nodes % segment_size:
        raise SegmentPlacementError(
            f"{SEGMENT_KEY}: {nodes_key}={num_nodes} is not a multiple of segment_size={segment_size} (the nodes are "
            "placed in whole segments of one NVLink domain each)"
        )
    by_domain: dict[str, list[tuple[int, str]]] = {}
    for node, (domain, rank) in topology.items():
        if domain != NVLINK_DOMAIN_UNKNOWN:  # no resource to pin such a node with
            by_domain.setdefault(domain, []).append((rank, node))
    domains = sorted(by_domain.items(), key=lambda item: (min(item[1])[0], item[0]))
    wanted = num_nodes // segment_size
    selected: list[str] = []
    for _, members in domains:
        segments = min(len(members) // segment_size, wanted - len(selected) // segment_size)
        selected += [node for _, node in sorted(members)[: segments * segment_size]]
    if len(selected) < num_nodes:
        per_domain = ", ".join(f"{domain}: {len(members)}" for domain, members in domains)
        without = sum(domain == NVLINK_DOMAIN_UNKNOWN for domain, _ in topology.values())
        raise SegmentPlacementError(
            f"{SEGMENT_KEY}: {nodes_key}={num_nodes} {role} nodes need {wanted} whole segment(s) of {segment_size} "
            f"nodes of one NVLink domain each, and the free nodes form {len(selected) // segment_size}; nodes per "
            f"domain: {{{per_domain}}}" + (f", {without} without a domain" if without else "")
        )
    chosen = set(selected)
    print(
        f"{SEGMENT_KEY}={segment_size}: {num_nodes} {role} nodes in {wanted} segment(s) on "
        f"{len({topology[node][0] for node in selected})} NVLink domain(s)",
        flush=True,
    )
    return selected, [node for node in topology if node not in chosen]


def _constraints(topology: Mapping[str, tuple[str, int]], selected: list[str]) -> list[dict[str, float]]:
    return [{topology[node][0]: DOMAIN_SHARE_PER_BUNDLE} for node in selected]


def _no_domain_line(segment_size: int) -> str:
    return (
        f"{SEGMENT_KEY}={segment_size} is set, but no Ray node reports an NVLink domain (a "
        f"'{NVLINK_DOMAIN_PREFIX}<ClusterUUID>' resource, which ray.sub registers from nvidia-smi): placing the nodes "
        "without NVLink-domain alignment"
    )
