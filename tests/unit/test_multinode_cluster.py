"""Placement across nodes on a simulated 2-node Ray cluster (`ray.cluster_utils.Cluster`, 2 CPUs per node).

This module owns its Ray cluster: it disconnects from any session cluster first, and the next module that asks for
the `ray_local` fixture starts a fresh one.
"""

from __future__ import annotations

import re

import pytest
import ray
from ray.util.placement_group import placement_group_table

from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster, ResourceInsufficientError, init_ray
from nemo_rl_clone.distributed.worker_groups import RayWorkerBuilder, RayWorkerGroup
from tests.conftest import attached_ray_cluster
from tests.unit.ray_test_actors import MODULE

# Runs alone (tests/machine_share.py): its ray.cluster_utils.Cluster is where any other ray.init() here would attach.
pytestmark = pytest.mark.serial

ECHO = f"{MODULE}.RankEchoActor"
KEYS = ["RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR"]


@pytest.fixture(scope="module")
def two_node_cluster():
    with attached_ray_cluster(num_nodes=2, cpus_per_node=2) as cluster:
        init_ray(num_cpus=64)  # ignored when attaching (init_ray attaches through RAY_ADDRESS, as on a real cluster)
        assert ray.cluster_resources()["CPU"] == 4
        yield cluster


def _node_ids(pg) -> list[str]:
    return [node for _, node in sorted(placement_group_table(pg)["bundles_to_node_id"].items())]


def test_one_placement_group_per_node_and_workers_on_distinct_nodes(two_node_cluster):
    cluster = RayVirtualCluster([2, 2], use_gpus=False, name="t-2node")
    try:
        pg0, pg1 = cluster.get_placement_groups()
        assert len(set(_node_ids(pg0))) == len(set(_node_ids(pg1))) == 1  # each packed on one node
        assert _node_ids(pg0)[0] != _node_ids(pg1)[0]  # ... and the two on different nodes
        assert cluster.node_count() == 2

        group = RayWorkerGroup(cluster, RayWorkerBuilder(ECHO))
        env = ray.get(group.run_all_workers_single_data("get_env", KEYS))
        nodes = ray.get(group.run_all_workers_single_data("get_node_id"))
        assert [(e["RANK"], e["LOCAL_RANK"], e["NODE_RANK"]) for e in env] == [
            ("0", "0", "0"),
            ("1", "1", "0"),
            ("2", "0", "1"),
            ("3", "1", "1"),
        ]
        assert nodes[0] == nodes[1] == _node_ids(pg0)[0]
        assert nodes[2] == nodes[3] == _node_ids(pg1)[0]
        assert len({e["MASTER_ADDR"] for e in env}) == 1  # everyone rendezvouses at rank 0's node
        group.shutdown()
    finally:
        cluster.shutdown()


def test_unified_spread_placement_group_ranks_by_physical_node(two_node_cluster):
    cluster = RayVirtualCluster([2, 2], use_gpus=False, placement_group_strategy="SPREAD")
    try:
        (pg,) = cluster.get_placement_groups()
        assert len(set(_node_ids(pg))) == 2
        assert cluster.node_count() == 2
        group = RayWorkerGroup(cluster, RayWorkerBuilder(ECHO))
        env = ray.get(group.run_all_workers_single_data("get_env", KEYS))
        nodes = ray.get(group.run_all_workers_single_data("get_node_id"))
        # Whatever bundle order Ray chose, ranks are grouped by node: two per node, node ranks 0 then 1.
        assert [e["NODE_RANK"] for e in env] == ["0", "0", "1", "1"]
        assert [e["LOCAL_RANK"] for e in env] == ["0", "1", "0", "1"]
        assert nodes[0] == nodes[1] != nodes[2] == nodes[3]
        group.shutdown()
    finally:
        cluster.shutdown()


def test_bundles_that_fit_in_total_but_not_on_one_node_fail_clearly(two_node_cluster):
    # 3 CPUs exist in total (4) but no single node has 3: the per-node capacities in the error explain why.
    with pytest.raises(ResourceInsufficientError) as excinfo:
        RayVirtualCluster([3], use_gpus=False, ready_timeout_s=2.0)
    message = str(excinfo.value)
    assert "per node [3] (one STRICT_PACK placement group per node), in total CPU 3, GPU 0" in message
    assert "The cluster has CPU 4, GPU 0" in message
    assert "on 2 node(s)" in message
    # Each node is listed with its capacity: "<ip> (<node id>): CPU 2, GPU 0".
    assert len(re.findall(r"\([0-9a-f]{8}\): CPU 2, GPU 0", message)) == 2
