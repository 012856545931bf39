"""The placement groups that every worker group of a run is built on (Ray start-up: `ray_startup`).

`RayVirtualCluster` reserves one *bundle* per worker slot: ``{"GPU": 1, "CPU": 1}`` on GPU machines or ``{"CPU": 1}``
with ``use_gpus=False`` (how everything runs on CPU machines). Bundles are grouped by logical node: one placement
group per entry of ``bundle_ct_per_node_list``. Worker groups (`worker_groups.RayWorkerGroup`) then place one actor
per bundle; with ``max_colocated_worker_groups > 1`` several groups (e.g. policy and vLLM generation) share the
bundles, each actor taking a ``1 / max_colocated_worker_groups`` share of the bundle's resources.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from nemo_rl_clone.distributed.cluster_fit import ray_node_resources
from nemo_rl_clone.distributed.ports import pick_free_port
from nemo_rl_clone.distributed.ray_actor_environment import PY_EXECUTABLES
from nemo_rl_clone.distributed.ray_startup import init_ray
from nemo_rl_clone.distributed.segment_topology import (
    NVLINK_DOMAIN_PREFIX,
    NVLINK_DOMAIN_UNKNOWN,
    TOPO_RANK_KEY,
    TOPO_RANK_UNKNOWN,
    SegmentPlacementError,
    get_ray_cluster_topology,
    partial_segments,
    prepare_segment_topology,
    select_segment_nodes,
    topology_ranks,
)
from nemo_rl_clone.utils.config_validation import SectionReads, check_at_least, check_port_range
from nemo_rl_clone.utils.unsupported_modules import refusing_getattr

logger = logging.getLogger(__name__)

PLACEMENT_STRATEGIES = ("STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD")
# Ray accepts fractional resources with 4 decimals; rounding *down* keeps n shares of a bundle within the bundle.
_RESOURCE_PRECISION = 10_000
# NeMo-RL's rendezvous band, the default: below Linux's ephemeral range (32768+), so that the port picked is not given
# to some outgoing connection before the worker group binds it
DEFAULT_MASTER_PORT_RANGE_LOW = 25000
DEFAULT_MASTER_PORT_RANGE_HIGH = 28000


@dataclass
class ClusterConfig(SectionReads):
    """``cluster`` section of the run config (NeMo-RL's keys). On CPU machines a "GPU" is one CPU worker slot."""

    gpus_per_node: int = 1  # worker slots per node (GPUs; on CPU machines, CPU worker slots)
    num_nodes: int = 1  # nodes the training cluster spans (checked against the Ray cluster's)
    # The ports the worker groups' torch.distributed rendezvous (MASTER_PORT) may use; null: NeMo-RL's 25000-28000.
    master_port_range_low: int | None = None
    master_port_range_high: int | None = None  # the range's last port
    # Nodes per NVLink-domain segment (`segment_topology`): the run's nodes are taken in whole segments of one
    # domain each. Null: placement ignores domains. Whether num_nodes divides into segments is checked at start-up,
    # and only when the nodes report domains (a CPU machine never does), as NeMo-RL does.
    segment_size: int | None = None

    def check(self) -> list[tuple[str, str]]:
        problems = check_at_least(self, 1, "gpus_per_node", "num_nodes", "segment_size")
        problems += check_port_range(self.master_port_range_low, self.master_port_range_high, "master_port_range_low")
        return problems


class ResourceInsufficientError(RuntimeError):
    """The placement groups asked for could not be reserved within the readiness timeout."""


@dataclass(frozen=True)
class BundleSlot:
    """One reserved bundle: where a worker can be placed.

    ``node_rank`` is the logical node: the placement group index for per-node placement groups, or the index of
    the physical node (in order of first appearance) for a unified placement group.
    """

    placement_group_index: int
    bundle_index: int
    node_rank: int


@ray.remote(num_cpus=0, num_gpus=0)
def _node_ip_and_free_port(port_range: tuple[int, int] | None, excluded: set[int]) -> tuple[str, int]:
    """This node's IP and a port free on it and not in ``excluded``: one the OS picks, or one in ``[low, high)``."""
    low, high = (None, None) if port_range is None else (port_range[0], port_range[1] - 1)
    return ray.util.get_node_ip_address(), pick_free_port(low, high, excluded)


def _note_simulated_nodes(name: str, num_nodes: int) -> None:
    """One line when a config's nodes outnumber the machines of the Ray cluster: a single-machine run with
    ``num_nodes > 1`` works (it tests a multi-node layout), but no node is a machine of its own."""
    machines = len(ray_node_resources())
    if num_nodes > 1 and machines < num_nodes:
        print(
            f"{name or 'cluster'}: {num_nodes} nodes asked for, and the Ray cluster has {machines} machine(s): the "
            "nodes are simulated, sharing machines (for one machine per node, start the run on a multi-node Ray "
            "cluster, e.g. with `sbatch ray.sub` or RAY_ADDRESS)",
            flush=True,
        )


class RayVirtualCluster:
    """Placement groups reserving ``sum(bundle_ct_per_node_list)`` worker slots.

    Args:
        bundle_ct_per_node_list: bundles (worker slots) per logical node, e.g. ``[8, 8]`` for two 8-GPU nodes.
        use_gpus: bundles are ``{"GPU": 1, "CPU": 1}``; with False, ``{"CPU": 1}``.
        max_colocated_worker_groups: how many worker groups share each bundle; each of their actors asks for
            ``1 / max_colocated_worker_groups`` of the bundle's CPU (and GPU), see `resources_per_worker`.
        num_gpus_per_node: GPUs per physical node; with ``use_gpus`` no logical node may ask for more.
        name: prefix of the placement group names (shows in ``ray status``).
        placement_group_strategy: ``"STRICT_PACK"`` (default) makes one placement group per logical node, each
            packed on one machine; when every node's bundles fill a machine, logical nodes are distinct machines.
            ``"PACK"``, ``"SPREAD"`` or ``"STRICT_SPREAD"`` make one unified placement group of all bundles with that
            Ray strategy; slots are then grouped by the physical node Ray chose.
        port_range_low, port_range_high: rendezvous ports (`get_master_address_and_port`) are taken from
            ``[port_range_low, port_range_high)``; give both or neither (default: NeMo-RL's ``[25000, 28000)``,
            `DEFAULT_MASTER_PORT_RANGE_LOW`/`_HIGH`).
        segment_size: nodes per NVLink-domain segment. When the nodes report domains, each domain must hold whole
            segments of this cluster's logical nodes (`SegmentPlacementError` otherwise); pin the nodes with the
            constraints of `prepare_segment_topology` to get that.
        node_resource_constraints: one dict of extra Ray resources per logical node, added to each of its bundles
            (e.g. ``{"nvlink_domain_<uuid>": 0.001}``, which pins the node to the machines of one NVLink domain).
        ready_timeout_s: how long to wait for the reservation before raising `ResourceInsufficientError`.

    Connects to Ray with `init_ray()` if this process is not connected yet. When the Ray nodes carry ray.sub's
    topology resources, logical nodes are ranked by (their NVLink domain's lowest ``topo_rank``, their ``topo_rank``)
    (`BundleSlot.node_rank`, hence worker ranks); otherwise in reservation order.

    Raises:
        ValueError: on an invalid argument (named in the message).
        ResourceInsufficientError: the bundles could not be reserved within ``ready_timeout_s``; the message names
            the resources asked for and those the cluster has. Nothing stays reserved after this error.
    """

    def __init__(
        self,
        bundle_ct_per_node_list: list[int],
        use_gpus: bool = True,
        max_colocated_worker_groups: int = 1,
        num_gpus_per_node: int = 8,
        name: str = "",
        placement_group_strategy: str = "STRICT_PACK",
        port_range_low: int | None = None,
        port_range_high: int | None = None,
        segment_size: int | None = None,
        node_resource_constraints: list[dict[str, float]] | None = None,
        ready_timeout_s: float = 180.0,
        collective_timeout_s: float | None = None,
    ) -> None:
        _check_cluster_args(
            bundle_ct_per_node_list,
            use_gpus,
            max_colocated_worker_groups,
            num_gpus_per_node,
            placement_group_strategy,
            ready_timeout_s,
        )
        _check_nemo_rl_extras(
            bundle_ct_per_node_list, port_range_low, port_range_high, segment_size, node_resource_constraints
        )
        self._handed_out_ports: set[int] = set()
        self.port_range = (DEFAULT_MASTER_PORT_RANGE_LOW, DEFAULT_MASTER_PORT_RANGE_HIGH)
        if port_range_low is not None and port_range_high is not None:
            self.port_range = (port_range_low, port_range_high)
        self.node_resource_constraints = [
            dict(c) for c in node_resource_constraints or [{}] * len(bundle_ct_per_node_list)
        ]
        self.bundle_ct_per_node_list = list(bundle_ct_per_node_list)
        self.use_gpus = use_gpus
        self.max_colocated_worker_groups = max_colocated_worker_groups
        self.num_gpus_per_node = num_gpus_per_node
        self.name = name
        self.placement_group_strategy = placement_group_strategy
        self.segment_size = segment_size
        self.ready_timeout_s = ready_timeout_s
        self.collective_timeout_s = collective_timeout_s  # its worker groups' process-group timeout (None: torch's)
        self.bundle_resources: dict[str, float] = {"GPU": 1, "CPU": 1} if use_gpus else {"CPU": 1}
        init_ray()
        self._placement_groups = self._reserve()
        try:
            self._slots = self._compute_slots()
        except BaseException:  # e.g. partial segments: release what was reserved
            self.shutdown()
            raise
        _note_simulated_nodes(self.name, len(self.bundle_ct_per_node_list))

    @property
    def is_unified(self) -> bool:
        return self.placement_group_strategy != "STRICT_PACK"

    def world_size(self) -> int:
        """Total number of bundles (worker slots)."""
        return sum(self.bundle_ct_per_node_list)

    def node_count(self) -> int:
        """Number of logical nodes (distinct ``BundleSlot.node_rank`` values)."""
        return len({slot.node_rank for slot in self._slots})

    def get_placement_groups(self) -> list[PlacementGroup]:
        """One placement group per logical node, or a single one for a unified placement group."""
        self._check_alive()
        return list(self._placement_groups)

    def get_bundle_slots(self) -> list[BundleSlot]:
        """Every bundle ordered by (node_rank, placement group, bundle index): the default worker rank order."""
        self._check_alive()
        return list(self._slots)

    def resources_per_worker(self) -> dict[str, float]:
        """Ray actor options for one worker of one of the colocated groups: ``{"num_cpus", "num_gpus"}``."""
        share = math.floor(_RESOURCE_PRECISION / self.max_colocated_worker_groups) / _RESOURCE_PRECISION
        return {"num_cpus": share, "num_gpus": share if self.use_gpus else 0.0}

    def get_master_address_and_port(
        self, placement_group_index: int | None = None, bundle_index: int | None = None
    ) -> tuple[str, int]:
        """IP of the node holding the given bundle (default: the first of `get_bundle_slots`, where rank 0 runs) and
        a port free on it at the time of the call, in the cluster's port range.

        Runs a zero-resource task in that bundle. A port is never handed out twice by this cluster, so colocated
        worker groups each get their own rendezvous port.
        """
        self._check_alive()
        if placement_group_index is None or bundle_index is None:
            # with topology ranks, rank 0's bundle need not be placement group 0's first
            first = self._slots[0]
            placement_group_index = (
                first.placement_group_index if placement_group_index is None else placement_group_index
            )
            bundle_index = first.bundle_index if bundle_index is None else bundle_index
        strategy = PlacementGroupSchedulingStrategy(
            self._placement_groups[placement_group_index], placement_group_bundle_index=bundle_index
        )
        ref = _node_ip_and_free_port.options(scheduling_strategy=strategy).remote(
            self.port_range, self._handed_out_ports
        )
        ready, _ = ray.wait([ref], timeout=self.ready_timeout_s)
        if not ready:
            ray.cancel(ref, force=True)
            raise ResourceInsufficientError(
                f"{self._label()}: the address probe in placement group {placement_group_index}, bundle "
                f"{bundle_index} did not run within {self.ready_timeout_s} s"
            )
        address, port = ray.get(ref)
        self._handed_out_ports.add(port)
        return address, port

    def get_available_address_and_port(self, pg_idx: int, bundle_idx: int) -> tuple[str, int]:
        """NeMo-RL's name for `get_master_address_and_port` of one bundle."""
        return self.get_master_address_and_port(pg_idx, bundle_idx)

    def get_available_addresses_and_ports_batch(
        self, pg_bundle_pairs: list[tuple[int, int]], batch_size: int = 256
    ) -> list[tuple[str, int]]:
        """`get_master_address_and_port` for each ``(placement group index, bundle index)``, in order.

        ``batch_size`` is accepted for NeMo-RL's signature; the probes run one after another.
        """
        del batch_size  # NeMo-RL bounds its parallel probes with it; ours are sequential
        return [self.get_master_address_and_port(pg_idx, bundle_idx) for pg_idx, bundle_idx in pg_bundle_pairs]

    def shutdown(self) -> bool:
        """Release the placement groups (actors still in them are killed by Ray); idempotent. Returns True."""
        if ray.is_initialized():  # otherwise the placement groups went with the Ray cluster
            for pg in self._placement_groups:
                remove_placement_group(pg)
        self._placement_groups = []
        self._slots = []
        return True

    def _check_alive(self) -> None:
        if not self._placement_groups:
            raise RuntimeError(f"{self._label()} was shut down; create a new RayVirtualCluster")

    def _label(self) -> str:
        return f"RayVirtualCluster {self.name!r}" if self.name else "RayVirtualCluster"

    def _reserve(self) -> list[PlacementGroup]:
        prefix = self.name or "nrl"
        node_bundles = [
            [{**self.bundle_resources, **constraints} for _ in range(count)]
            for count, constraints in zip(self.bundle_ct_per_node_list, self.node_resource_constraints, strict=True)
        ]
        if self.is_unified:
            bundles = [bundle for node in node_bundles for bundle in node]
            groups = [placement_group(bundles, strategy=self.placement_group_strategy, name=f"{prefix}-unified")]
        else:
            groups = [
                placement_group(bundles, strategy="STRICT_PACK", name=f"{prefix}-node{i}")
                for i, bundles in enumerate(node_bundles)
            ]
        try:
            self._wait_until_ready(groups)
        except BaseException:  # incl. KeyboardInterrupt while waiting: never leave a reservation behind
            for pg in groups:
                remove_placement_group(pg)
            raise
        return groups

    def _wait_until_ready(self, groups: list[PlacementGroup]) -> None:
        """Poll with exponential backoff until every group is placed or the readiness timeout passes."""
        deadline = time.monotonic() + self.ready_timeout_s
        pending = [pg.ready() for pg in groups]
        poll_s = 0.5
        while True:
            remaining = deadline - time.monotonic()
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=max(0.0, min(poll_s, remaining)))
            if not pending:
                return
            if time.monotonic() >= deadline:
                raise ResourceInsufficientError(self._describe_shortfall(len(pending), len(groups)))
            logger.info(
                "%s: %d of %d placement groups still waiting for resources (%.1f s left)",
                self._label(),
                len(pending),
                len(groups),
                deadline - time.monotonic(),
            )
            poll_s = min(poll_s * 2, 10.0)

    def _describe_shortfall(self, num_pending: int, num_groups: int) -> str:
        total = {key: value * self.world_size() for key, value in self.bundle_resources.items()}
        layout = (
            f"one unified {self.placement_group_strategy} placement group"
            if self.is_unified
            else "one STRICT_PACK placement group per node"
        )
        cluster = ray.cluster_resources()
        available = ray.available_resources()
        nodes = [
            f"{node['NodeManagerAddress']} ({node['NodeID'][:8]}): "
            + _format_resources({k: node["Resources"].get(k, 0.0) for k in ("CPU", "GPU")})
            for node in ray.nodes()
            if node["Alive"]
        ]
        pinned = [c for c in self.node_resource_constraints if c]
        return (
            f"{self._label()}: {num_pending} of {num_groups} placement groups not ready after "
            f"{self.ready_timeout_s} s. Asked for bundles of {self.bundle_resources} per node "
            f"{self.bundle_ct_per_node_list} ({layout}), in total "
            f"{_format_resources(total)}. The cluster has {_format_resources(cluster)} "
            f"(available now: {_format_resources(available)}) on {len(nodes)} node(s): {'; '.join(nodes)}. "
            + (f"{len(pinned)} node(s) are pinned by node_resource_constraints, e.g. {pinned[0]}. " if pinned else "")
            + "Ask for fewer workers per node or nodes (cluster.gpus_per_node / cluster.num_nodes), free resources "
            "held by other jobs, or add nodes."
        )

    def _compute_slots(self) -> list[BundleSlot]:
        if self.is_unified:
            node_of_bundle = placement_group_table(self._placement_groups[0])["bundles_to_node_id"]
            # logical nodes of a unified group: its physical nodes, in order of first appearance
            nodes = list(dict.fromkeys(node_of_bundle[b] for b in range(self.world_size())))
            ranks = dict(zip(nodes, self._node_ranks(len(nodes), lambda: nodes), strict=True))
            slots = [BundleSlot(0, b, ranks[node_of_bundle[b]]) for b in range(self.world_size())]
        else:
            groups = self._placement_groups
            order = self._node_ranks(
                len(groups), lambda: [placement_group_table(pg)["bundles_to_node_id"][0] for pg in groups]
            )
            slots = [
                BundleSlot(placement_group_index=i, bundle_index=b, node_rank=order[i])
                for i, count in enumerate(self.bundle_ct_per_node_list)
                for b in range(count)
            ]
        return sorted(slots, key=lambda slot: (slot.node_rank, slot.placement_group_index, slot.bundle_index))

    def _node_ranks(self, count: int, physical_nodes: Callable[[], list[str]]) -> list[int]:
        """The rank of each of ``count`` logical nodes: by NVLink domain and topo rank when the Ray nodes report them,
        else reservation order. ``physical_nodes`` (each logical node's Ray node id) is only looked up then."""
        topology = get_ray_cluster_topology()
        if all(info == (NVLINK_DOMAIN_UNKNOWN, TOPO_RANK_UNKNOWN) for info in topology.values()):
            return list(range(count))
        nodes = physical_nodes()
        partial = partial_segments(nodes, topology, self.segment_size) if self.segment_size else {}
        if partial:
            raise SegmentPlacementError(
                f"{self._label()}: segment_size={self.segment_size}, and NVLink domains hold partial segments of its "
                f"{count} nodes ({', '.join(f'{d}: {n}' for d, n in partial.items())}); pin the nodes with "
                "node_resource_constraints from prepare_segment_topology"
            )
        return topology_ranks(nodes, topology)


def _format_resources(resources: dict[str, float]) -> str:
    return ", ".join(f"{key} {resources.get(key, 0.0):g}" for key in ("CPU", "GPU"))


def _check_nemo_rl_extras(
    bundle_ct_per_node_list: list[int],
    port_range_low: int | None,
    port_range_high: int | None,
    segment_size: int | None,
    node_resource_constraints: list[dict[str, float]] | None,
) -> None:
    if segment_size is not None and (not isinstance(segment_size, int) or segment_size < 1):
        raise ValueError(f"segment_size must be None or an int >= 1, got {segment_size!r}")
    if (port_range_low is None) != (port_range_high is None):
        raise ValueError(
            f"give both port_range_low and port_range_high or neither, got {port_range_low} and {port_range_high}"
        )
    if port_range_low is not None and port_range_high is not None and not 0 < port_range_low < port_range_high <= 65536:
        raise ValueError(
            f"port range [{port_range_low}, {port_range_high}) must satisfy 0 < port_range_low < port_range_high "
            "<= 65536"
        )
    if node_resource_constraints is not None and len(node_resource_constraints) != len(bundle_ct_per_node_list):
        raise ValueError(
            f"node_resource_constraints has {len(node_resource_constraints)} entries but bundle_ct_per_node_list "
            f"has {len(bundle_ct_per_node_list)} nodes; give one dict per node"
        )


def _check_cluster_args(
    bundle_ct_per_node_list: list[int],
    use_gpus: bool,
    max_colocated_worker_groups: int,
    num_gpus_per_node: int,
    placement_group_strategy: str,
    ready_timeout_s: float,
) -> None:
    if not isinstance(bundle_ct_per_node_list, (list, tuple)) or not bundle_ct_per_node_list:
        raise ValueError(f"bundle_ct_per_node_list must be a non-empty list of ints, got {bundle_ct_per_node_list!r}")
    for node, count in enumerate(bundle_ct_per_node_list):
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"bundle_ct_per_node_list[{node}] must be an int >= 1, got {count!r}")
        if use_gpus and count > num_gpus_per_node:
            raise ValueError(
                f"bundle_ct_per_node_list[{node}] = {count} GPU bundles exceeds num_gpus_per_node = {num_gpus_per_node}"
            )
    if not isinstance(max_colocated_worker_groups, int) or max_colocated_worker_groups < 1:
        raise ValueError(f"max_colocated_worker_groups must be an int >= 1, got {max_colocated_worker_groups!r}")
    if not ready_timeout_s > 0:
        raise ValueError(f"ready_timeout_s must be > 0, got {ready_timeout_s!r}")
    if placement_group_strategy not in PLACEMENT_STRATEGIES:
        raise ValueError(
            f"placement_group_strategy must be one of {PLACEMENT_STRATEGIES}, got {placement_group_strategy!r}"
        )


__all__ = [
    "DEFAULT_MASTER_PORT_RANGE_HIGH",
    "DEFAULT_MASTER_PORT_RANGE_LOW",
    "NVLINK_DOMAIN_PREFIX",
    "NVLINK_DOMAIN_UNKNOWN",
    "PLACEMENT_STRATEGIES",
    "PY_EXECUTABLES",
    "TOPO_RANK_KEY",
    "TOPO_RANK_UNKNOWN",
    "BundleSlot",
    "ClusterConfig",
    "RayVirtualCluster",
    "ResourceInsufficientError",
    "get_ray_cluster_topology",
    "init_ray",
    "prepare_segment_topology",
    "select_segment_nodes",
]

# NeMo-RL's get_reordered_bundle probes each bundle's GPU id to order a unified group's bundles; here the cluster
# orders its logical nodes by topology itself (`_node_ranks`), with no probe.
_GYM_PORTS = ("DEFAULT_GYM_PORT_RANGE_LOW", "DEFAULT_GYM_PORT_RANGE_HIGH")
__getattr__ = refusing_getattr(
    __name__,
    {"get_reordered_bundle": "per-bundle GPU-id probe (RayVirtualCluster ranks its nodes by NVLink domain itself)"}
    | dict.fromkeys(_GYM_PORTS, "NeMo-Gym environments"),
)
