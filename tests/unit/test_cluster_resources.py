"""cluster.* against the nodes of a running Ray cluster: `check_cluster_shape` on made-up node lists, and the
pre-flight check of an attached run on a real 2-node cluster (`ray.cluster_utils.Cluster`, 2 CPUs per node).

The real cluster belongs to this module: it disconnects from any session cluster first, as
tests/unit/test_multinode_cluster.py does.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import ray

from nemo_rl_clone.algorithms.run.preflight import preflight
from nemo_rl_clone.distributed.cluster_fit import NodeResources, check_cluster_shape, ray_node_resources
from nemo_rl_clone.distributed.virtual_cluster import ClusterConfig
from nemo_rl_clone.utils.errors import UserInputError
from tests.conftest import attached_ray_cluster

# Runs alone (tests/machine_share.py): its module's ray.cluster_utils.Cluster, alive until the module ends, is where any other ray.init() here would attach.
pytestmark = pytest.mark.serial

WHERE = "the Ray cluster at 10.0.0.1:6379"
GPU_NODE = NodeResources(cpus=32, gpus=8)
CPU_NODE = NodeResources(cpus=4, gpus=0)
HEAD = NodeResources(cpus=0, gpus=0)  # a KubeRay head started with num-cpus 0: it hosts no workers


def check(nodes: list[NodeResources], use_gpus: bool, **shapes: tuple[int, int]) -> list[str]:
    return check_cluster_shape(nodes, shapes, use_gpus, WHERE)


@pytest.mark.parametrize(
    ("nodes", "use_gpus", "shape"),
    [
        ([HEAD, GPU_NODE, GPU_NODE], True, (8, 2)),  # exactly the cluster
        ([GPU_NODE, GPU_NODE], True, (4, 4)),  # two logical nodes per machine
        ([GPU_NODE, GPU_NODE, GPU_NODE], True, (8, 1)),  # a bigger cluster than the run needs is fine
        ([HEAD, CPU_NODE, CPU_NODE], False, (1, 2)),  # CPU: a "GPU" of the config is one CPU slot
        ([HEAD, CPU_NODE], False, (4, 1)),
    ],
)
def test_shapes_the_cluster_holds_pass(nodes, use_gpus, shape):
    assert check(nodes, use_gpus, cluster=shape) == []


def test_too_many_nodes_names_both_keys_and_the_cluster():
    assert check([HEAD, GPU_NODE, GPU_NODE], True, cluster=(8, 3)) == [
        "cluster.num_nodes=3, cluster.gpus_per_node=8: the Ray cluster at 10.0.0.1:6379 has room for 2 such node(s), "
        "not 3 (a worker slot takes 1 GPU and 1 CPU; its alive nodes: 2 x (CPU 32, GPU 8), 1 x (CPU 0, GPU 0))"
    ]


def test_more_gpus_per_node_than_any_node_has():
    (problem,) = check([GPU_NODE, GPU_NODE], True, cluster=(16, 1))
    assert problem.startswith("cluster.num_nodes=1, cluster.gpus_per_node=16: no node of the Ray cluster at ")
    assert "has room for 16 worker slots" in problem and "2 x (CPU 32, GPU 8)" in problem


def test_gpu_slots_are_limited_by_cpus_too():
    # Each bundle is {"GPU": 1, "CPU": 1}: 8 GPUs with 4 CPUs hold 4 workers.
    (problem,) = check([NodeResources(cpus=4, gpus=8)], True, cluster=(8, 1))
    assert "no node of" in problem and "a worker slot takes 1 GPU and 1 CPU" in problem


def test_cpu_cluster_counts_cpus_and_ignores_gpus():
    (problem,) = check([HEAD, CPU_NODE], False, cluster=(4, 2))
    assert problem == (
        "cluster.num_nodes=2, cluster.gpus_per_node=4: the Ray cluster at 10.0.0.1:6379 has room for 1 such node(s), "
        "not 2 (on CPU a worker slot takes 1 CPU; its alive nodes: 1 x (CPU 0, GPU 0), 1 x (CPU 4, GPU 0))"
    )
    assert check([NodeResources(cpus=2, gpus=8)], False, cluster=(2, 1)) == []  # CPU bundles: GPUs don't count
    # With GPU bundles, CPU-only nodes hold nothing.
    assert "no node of" in check([CPU_NODE], True, cluster=(1, 1))[0]


def test_no_alive_nodes():
    (problem,) = check([], False, cluster=(1, 1))
    assert problem.endswith("(on CPU a worker slot takes 1 CPU; its alive nodes: none)")


def test_separate_generation_resources_count_on_their_own_and_together():
    gen = "policy.generation.colocated.resources"
    nodes = [GPU_NODE, GPU_NODE]
    assert check_cluster_shape(nodes, {"cluster": (8, 1), gen: (8, 1)}, True, WHERE) == []
    (alone,) = check_cluster_shape(nodes, {"cluster": (8, 1), gen: (8, 3)}, True, WHERE)
    assert alone.startswith(f"{gen}.num_nodes=3, {gen}.gpus_per_node=8: ")
    (together,) = check_cluster_shape(nodes, {"cluster": (8, 2), gen: (4, 1)}, True, WHERE)
    assert together.startswith(
        f"cluster.gpus_per_node * cluster.num_nodes (16) + {gen}.gpus_per_node * {gen}.num_nodes (4): "
        "20 worker slots, the Ray cluster at 10.0.0.1:6379 has 16 ("
    )


def test_invalid_shapes_are_left_to_the_config_checks():
    assert check([CPU_NODE], False, cluster=(0, 1)) == []


# A real cluster: the check an attached run's pre-flight does.


@pytest.fixture(scope="module")
def attached_two_node_cluster():
    with attached_ray_cluster(num_nodes=2, cpus_per_node=2) as cluster:
        yield cluster


def _config(gpus_per_node: int, num_nodes: int) -> SimpleNamespace:
    return SimpleNamespace(cluster=ClusterConfig(gpus_per_node=gpus_per_node, num_nodes=num_nodes))


def test_preflight_checks_cluster_against_the_attached_cluster(attached_two_node_cluster):
    preflight(_config(gpus_per_node=2, num_nodes=2))  # attaches; 2 nodes of 2 CPUs hold it
    assert ray.is_initialized()
    assert ray_node_resources() == [NodeResources(cpus=2, gpus=0)] * 2
    with pytest.raises(UserInputError) as excinfo:
        preflight(_config(gpus_per_node=1, num_nodes=5))
    address = ray.get_runtime_context().gcs_address
    assert excinfo.value.problems == [
        f"cluster.num_nodes=5, cluster.gpus_per_node=1: the Ray cluster at {address} has room for 4 such node(s), "
        "not 5 (on CPU a worker slot takes 1 CPU; its alive nodes: 2 x (CPU 2, GPU 0))"
    ]
    with pytest.raises(UserInputError, match=r"cluster.gpus_per_node=3: no node of the Ray cluster at .* room for 3 "):
        preflight(_config(gpus_per_node=3, num_nodes=1))
