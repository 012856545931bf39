"""RayVirtualCluster and init_ray on a real local Ray cluster (CPU bundles)."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest
import ray
from ray.util.placement_group import placement_group_table

from nemo_rl_clone.distributed import virtual_cluster
from nemo_rl_clone.distributed.ray_actor_environment import PY_EXECUTABLES as REGISTRY_PY_EXECUTABLES
from nemo_rl_clone.distributed.segment_topology import SegmentPlacementError
from nemo_rl_clone.distributed.virtual_cluster import (
    PY_EXECUTABLES,
    BundleSlot,
    ClusterConfig,
    RayVirtualCluster,
    ResourceInsufficientError,
    init_ray,
    prepare_segment_topology,
)
from nemo_rl_clone.distributed.worker_groups import RayWorkerBuilder
from tests.unit.ray_test_actors import MODULE


def _pg_state(pg) -> str:
    return placement_group_table(pg)["state"]


def test_cluster_config_check_names_bad_keys():
    assert ClusterConfig(gpus_per_node=8, num_nodes=2).check() == []
    assert ClusterConfig(gpus_per_node=0, num_nodes=-1).check() == [
        ("gpus_per_node", "must be >= 1, got 0"),
        ("num_nodes", "must be >= 1, got -1"),
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bundle_ct_per_node_list": []}, "bundle_ct_per_node_list must be a non-empty list"),
        ({"bundle_ct_per_node_list": [2, 0]}, r"bundle_ct_per_node_list\[1\] must be an int >= 1, got 0"),
        ({"bundle_ct_per_node_list": [9], "use_gpus": True}, r"\[0\] = 9 GPU bundles exceeds num_gpus_per_node = 8"),
        ({"bundle_ct_per_node_list": [1], "max_colocated_worker_groups": 0}, "max_colocated_worker_groups must be"),
        (
            {"bundle_ct_per_node_list": [1], "placement_group_strategy": "PACKED"},
            "placement_group_strategy must be one",
        ),
        ({"bundle_ct_per_node_list": [1], "ready_timeout_s": 0}, "ready_timeout_s must be > 0"),
        ({"bundle_ct_per_node_list": [1], "segment_size": 0}, "segment_size must be None or an int >= 1, got 0"),
        ({"bundle_ct_per_node_list": [1], "port_range_low": 1400}, "give both port_range_low and port_range_high"),
        (
            {"bundle_ct_per_node_list": [1], "port_range_low": 2000, "port_range_high": 1400},
            r"port range \[2000, 1400\) must satisfy",
        ),
        (
            {"bundle_ct_per_node_list": [1, 1], "node_resource_constraints": [{}]},
            "node_resource_constraints has 1 entries but bundle_ct_per_node_list has 2 nodes",
        ),
    ],
)
def test_invalid_arguments_are_rejected_before_touching_ray(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RayVirtualCluster(**{"use_gpus": False, **kwargs})


def test_init_ray_is_idempotent(ray_local):
    gcs_address = ray.get_runtime_context().gcs_address
    cpus = ray.cluster_resources()["CPU"]
    init_ray(num_cpus=1)  # already connected: neither restarts nor changes the cluster
    assert ray.get_runtime_context().gcs_address == gcs_address
    assert ray.cluster_resources()["CPU"] == cpus != 1


def test_per_node_placement_groups_and_master_address(ray_local, capsys):
    cluster = RayVirtualCluster([2, 1], use_gpus=False, name="t-per-node")
    # two nodes on this one machine work, and say so
    assert capsys.readouterr().out == (
        "t-per-node: 2 nodes asked for, and the Ray cluster has 1 machine(s): the nodes are simulated, sharing "
        "machines (for one machine per node, start the run on a multi-node Ray cluster, e.g. with `sbatch ray.sub` "
        "or RAY_ADDRESS)\n"
    )
    try:
        groups = cluster.get_placement_groups()
        assert len(groups) == 2
        assert [pg.bundle_specs for pg in groups] == [[{"CPU": 1.0}] * 2, [{"CPU": 1.0}]]
        assert all(_pg_state(pg) == "CREATED" for pg in groups)
        assert cluster.world_size() == 3
        assert cluster.node_count() == 2
        assert cluster.get_bundle_slots() == [BundleSlot(0, 0, 0), BundleSlot(0, 1, 0), BundleSlot(1, 0, 1)]
        assert cluster.resources_per_worker() == {"num_cpus": 1.0, "num_gpus": 0.0}

        address, port = cluster.get_master_address_and_port(placement_group_index=1)
        assert address == ray.util.get_node_ip_address()  # single machine: the bundle's node is this one
        assert 25000 <= port < 28000  # NeMo-RL's default band (DEFAULT_MASTER_PORT_RANGE_LOW/HIGH)
        with socket.socket() as sock:  # the port was free when picked and nothing has taken it since
            sock.bind(("", port))
    finally:
        cluster.shutdown()
    assert all(_pg_state(pg) == "REMOVED" for pg in groups)
    cluster.shutdown()  # idempotent
    with pytest.raises(RuntimeError, match="was shut down"):
        cluster.get_placement_groups()


def test_nemo_rl_style_cluster_ports_constraints_and_builder_call(ray_local):
    assert PY_EXECUTABLES is REGISTRY_PY_EXECUTABLES
    node_resource = f"node:{ray.util.get_node_ip_address()}"  # Ray gives every node this resource, amount 1
    # cluster.segment_size's constraints, from a topology in which that resource stands for an NVLink domain
    topology = {ray.get_runtime_context().get_node_id(): (node_resource, 1)}
    constraints, _, _ = prepare_segment_topology(1, 1, topology=topology)
    cluster = RayVirtualCluster(
        bundle_ct_per_node_list=[2],
        use_gpus=False,
        max_colocated_worker_groups=1,
        num_gpus_per_node=1,
        name="t-nemo",
        placement_group_strategy="STRICT_PACK",
        port_range_low=20000,
        port_range_high=20100,
        segment_size=1,
        node_resource_constraints=constraints,
    )
    try:
        (pg,) = cluster.get_placement_groups()
        assert pg.bundle_specs == [{"CPU": 1.0, node_resource: 0.001}] * 2
        ports = [port for _, port in cluster.get_available_addresses_and_ports_batch([(0, 0), (0, 1)])]
        ports.append(cluster.get_available_address_and_port(0, 1)[1])
        ports.append(cluster.get_master_address_and_port()[1])
        assert all(20000 <= port < 20100 for port in ports) and len(set(ports)) == 4  # never handed out twice
        # NeMo-RL's builder call: one actor in a given bundle, options as keyword arguments.
        builder = RayWorkerBuilder(f"{MODULE}.RankEchoActor", tag="direct")
        actor = builder(pg, 1, num_gpus=0, num_cpus=0.5, runtime_env={"env_vars": {"RANK": "7"}})
        assert ray.get(actor.echo.remote("hi")) == (7, "hi")
        assert ray.get(actor.get_tag.remote()) == "direct"
        ray.kill(actor)
        with pytest.raises(NotImplementedError, match="not supported yet: bundle_indices"):
            builder(pg, 0, num_gpus=0, bundle_indices=(0, [0, 1]))
    finally:
        assert cluster.shutdown() is True


@pytest.mark.serial  # needs fixed ports free
def test_port_range_is_never_handed_out_twice(ray_local):
    cluster = RayVirtualCluster([1], use_gpus=False, port_range_low=20200, port_range_high=20203)
    try:
        ports = {cluster.get_master_address_and_port()[1] for _ in range(3)}
        assert ports == {20200, 20201, 20202}
        with pytest.raises(RuntimeError, match=r"no free TCP port in 20200..20202 on .* besides 3 already taken"):
            cluster.get_master_address_and_port()
    finally:
        cluster.shutdown()


def test_unified_placement_group_groups_slots_by_physical_node(ray_local):
    cluster = RayVirtualCluster([1, 2], use_gpus=False, placement_group_strategy="PACK")
    try:
        (pg,) = cluster.get_placement_groups()
        assert pg.bundle_specs == [{"CPU": 1.0}] * 3
        # One machine here: every bundle is on physical node 0, whatever the requested per-node split.
        assert cluster.get_bundle_slots() == [BundleSlot(0, b, 0) for b in range(3)]
        assert cluster.node_count() == 1
        assert cluster.world_size() == 3
    finally:
        cluster.shutdown()


def test_partial_nvlink_segments_are_refused_and_released(ray_local, monkeypatch):
    node = ray.get_runtime_context().get_node_id()  # as ray.sub's resources would describe it
    monkeypatch.setattr(virtual_cluster, "get_ray_cluster_topology", lambda: {node: ("nvlink_domain_a", 1)})
    cluster = RayVirtualCluster([1, 1], use_gpus=False, name="t-segment", segment_size=2)
    try:  # both logical nodes in domain a: one whole segment
        assert cluster.get_bundle_slots() == [BundleSlot(0, 0, 0), BundleSlot(1, 0, 1)]
    finally:
        cluster.shutdown()
    with pytest.raises(SegmentPlacementError, match=r"hold partial segments of its 1 nodes \(nvlink_domain_a: 1\)"):
        RayVirtualCluster([1], use_gpus=False, name="t-partial", segment_size=2)
    states = [entry["state"] for entry in placement_group_table().values() if entry["name"] == "t-partial-node0"]
    assert states == ["REMOVED"]


def test_colocated_groups_get_a_share_of_each_bundle(ray_local):
    cluster = RayVirtualCluster([1], use_gpus=False, max_colocated_worker_groups=3)
    try:
        # 1/3 rounded down to Ray's 4-decimal resource precision, so three shares fit in one bundle.
        assert cluster.resources_per_worker() == {"num_cpus": 0.3333, "num_gpus": 0.0}
    finally:
        cluster.shutdown()


def test_unsatisfiable_request_fails_with_asked_and_available(ray_local):
    cpus = ray.cluster_resources()["CPU"]
    with pytest.raises(ResourceInsufficientError) as excinfo:
        RayVirtualCluster([64], use_gpus=False, name="too-big", ready_timeout_s=2.0)
    message = str(excinfo.value)
    assert "RayVirtualCluster 'too-big': 1 of 1 placement groups not ready after 2.0 s" in message
    assert "bundles of {'CPU': 1} per node [64]" in message
    assert "in total CPU 64, GPU 0" in message
    assert f"The cluster has CPU {cpus:g}, GPU 0" in message
    assert "on 1 node(s)" in message
    # Nothing stays reserved: the pending group was removed.
    states = [entry["state"] for entry in placement_group_table().values() if entry["name"] == "too-big-node0"]
    assert states == ["REMOVED"]


def test_gpu_request_on_a_cpu_cluster_names_the_missing_gpus(ray_local):
    with pytest.raises(ResourceInsufficientError, match=r"in total CPU 2, GPU 2\. The cluster has CPU \d+, GPU 0"):
        RayVirtualCluster([2], use_gpus=True, ready_timeout_s=1.0)


def test_ray_logs_go_to_log_dir_only_when_the_socket_path_fits(tmp_path, caplog):
    from nemo_rl_clone.distributed.ray_startup import _ray_temp_dir

    assert _ray_temp_dir(None) is None
    deep = tmp_path / ("x" * 40)
    assert _ray_temp_dir(deep) is None
    assert "too long for Ray's unix sockets" in caplog.text
    short = Path("/tmp") / f"nrl-{os.getpid()}"
    try:
        assert _ray_temp_dir(short) == str(short / "ray")
        assert (short / "ray").is_dir()
    finally:
        shutil.rmtree(short, ignore_errors=True)


def test_a_stale_ray_start_address_file_is_ignored_in_one_line(tmp_path, monkeypatch, caplog):
    """A crash or reboot leaves `ray start`'s address file naming a dead cluster: attaching to it would retry for
    minutes, so the run starts its own cluster and says why; a live address is still attached to."""
    import socket

    from ray._private.utils import get_ray_address_file

    from nemo_rl_clone.distributed.ray_startup import _existing_cluster_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    address_file = Path(get_ray_address_file(None))
    address_file.parent.mkdir(parents=True, exist_ok=True)
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))  # Ray rewrites a loopback address to the node's own
        listener.listen()
        port = listener.getsockname()[1]
        address_file.write_text(f"127.0.0.1:{port}")
        live = _existing_cluster_address()
        assert live is not None and live.endswith(f":{port}")
    address_file.write_text(live)  # the listener is closed: nothing answers there now
    assert _existing_cluster_address() is None
    assert f"Ignoring {address_file}: it names the Ray cluster {live}, where nothing answers" in caplog.text
