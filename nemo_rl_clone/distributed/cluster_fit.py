"""Whether a run's worker layout fits the machines: the local machine before Ray starts, or an attached cluster's nodes.

Pre-flight reads these (one line per problem) so that a run that cannot be placed fails at once, not after the
placement-group timeout of `virtual_cluster.RayVirtualCluster`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import ray


def check_local_cluster_fits(worker_slots: dict[str, int], use_gpus: bool) -> list[str]:
    """Problems (one line each) if a local cluster on this machine cannot hold ``worker_slots`` (config key → slots,
    e.g. ``{"cluster.gpus_per_node * cluster.num_nodes": 2}``): one CPU per slot, and one GPU with ``use_gpus``.
    Without this, the placement groups would wait `ready_timeout_s` before failing."""
    from ray._private.utils import get_num_cpus

    total = sum(worker_slots.values())
    keys = " + ".join(f"{key} ({slots})" for key, slots in worker_slots.items())
    available = {"CPU": int(get_num_cpus())}
    if use_gpus:
        import torch

        available["GPU"] = torch.cuda.device_count()
    return [
        f"{keys}: {total} worker slots, each needs one {kind}, and this machine has {count} {kind}s"
        for kind, count in available.items()
        if total > count
    ]


@dataclass(frozen=True)
class NodeResources:
    """What one alive Ray node offers worker bundles: its total CPUs and GPUs (not what is free right now)."""

    cpus: float
    gpus: float

    def worker_slots(self, use_gpus: bool) -> int:
        """Bundles of `RayVirtualCluster` this node holds: ``{"GPU": 1, "CPU": 1}`` each, or ``{"CPU": 1}``."""
        return int(min(self.cpus, self.gpus) if use_gpus else self.cpus)


def ray_node_resources() -> list[NodeResources]:
    """The alive nodes of the Ray cluster this process is connected to."""
    return [
        NodeResources(cpus=node["Resources"].get("CPU", 0.0), gpus=node["Resources"].get("GPU", 0.0))
        for node in ray.nodes()
        if node["Alive"]
    ]


def check_cluster_shape(
    nodes: list[NodeResources], shapes: dict[str, tuple[int, int]], use_gpus: bool, where: str
) -> list[str]:
    """Problems (one line each) if the Ray cluster of ``nodes`` cannot hold the worker layouts of ``shapes``.

    ``shapes`` maps a config section to its ``(gpus_per_node, num_nodes)``, e.g. ``{"cluster": (8, 2)}``. A logical
    node of ``gpus_per_node`` slots must fit on one machine (its placement group is STRICT_PACK); a machine with room
    for several logical nodes may hold several. On CPU (``use_gpus=False``) a "GPU" of the config is one CPU slot.
    Totals are compared, not free resources: a busy cluster is left to the placement-group timeout, which says so.
    ``where`` names the cluster in the messages, e.g. ``"the Ray cluster at 10.0.0.1:6379"``.
    """
    slots = [node.worker_slots(use_gpus) for node in nodes]
    has = f"{_describe_slot(use_gpus)}; its alive nodes: {_summarize_nodes(nodes)}"
    problems = []
    for section, (per_node, num_nodes) in shapes.items():
        if per_node < 1 or num_nodes < 1:  # the config's own checks report these
            continue
        keys = f"{section}.num_nodes={num_nodes}, {section}.gpus_per_node={per_node}"
        room = sum(count // per_node for count in slots)
        if max(slots, default=0) < per_node:
            problems.append(f"{keys}: no node of {where} has room for {per_node} worker slots ({has})")
        elif room < num_nodes:
            problems.append(f"{keys}: {where} has room for {room} such node(s), not {num_nodes} ({has})")
    total = sum(per_node * num_nodes for per_node, num_nodes in shapes.values())
    if not problems and len(shapes) > 1 and total > sum(slots):
        keys = " + ".join(
            f"{section}.gpus_per_node * {section}.num_nodes ({g * n})" for section, (g, n) in shapes.items()
        )
        problems.append(f"{keys}: {total} worker slots, {where} has {sum(slots)} ({has})")
    return problems


def _describe_slot(use_gpus: bool) -> str:
    return "a worker slot takes 1 GPU and 1 CPU" if use_gpus else "on CPU a worker slot takes 1 CPU"


def _summarize_nodes(nodes: list[NodeResources]) -> str:
    """``"2 x (CPU 16, GPU 8), 1 x (CPU 4, GPU 0)"``: nodes grouped by size, so a large cluster stays one short line."""
    if not nodes:
        return "none"
    sizes = Counter((node.cpus, node.gpus) for node in nodes)
    return ", ".join(f"{count} x (CPU {cpus:g}, GPU {gpus:g})" for (cpus, gpus), count in sizes.most_common())
