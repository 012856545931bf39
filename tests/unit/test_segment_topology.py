"""cluster.segment_size: node selection by whole NVLink-domain segments, on synthetic topologies (no Ray)."""

from __future__ import annotations

import pytest

from nemo_rl_clone.distributed import segment_topology
from nemo_rl_clone.distributed.segment_topology import (
    NVLINK_DOMAIN_UNKNOWN,
    TOPO_RANK_UNKNOWN,
    SegmentPlacement,
    SegmentPlacementError,
    partial_segments,
    prepare_segment_topology,
    select_segment_nodes,
    topology_from_nodes,
    topology_ranks,
)
from nemo_rl_clone.distributed.virtual_cluster import ClusterConfig
from nemo_rl_clone.utils.errors import UserInputError

A, B, C = "nvlink_domain_a", "nvlink_domain_b", "nvlink_domain_c"
NO_DOMAIN_LINE = (
    "cluster.segment_size=4 is set, but no Ray node reports an NVLink domain (a 'nvlink_domain_<ClusterUUID>' "
    "resource, which ray.sub registers from nvidia-smi): placing the nodes without NVLink-domain alignment\n"
)


def _topology() -> dict[str, tuple[str, int]]:
    """Domain b comes first (lowest topo rank 1) although listed last; a's 5 nodes hold 2 whole segments of 2."""
    return {
        "a14": (A, 14),
        "a10": (A, 10),
        "a12": (A, 12),
        "a11": (A, 11),
        "a13": (A, 13),
        "c20": (C, 20),
        "c21": (C, 21),
        "c22": (C, 22),
        "c23": (C, 23),
        "cpu": (NVLINK_DOMAIN_UNKNOWN, 0),  # e.g. a CPU-only head node: never selected
        "b3": (B, 3),
        "b2": (B, 2),
        "b1": (B, 1),
    }


def test_whole_segments_by_domain_in_topological_order():
    selected, remaining = select_segment_nodes(_topology(), segment_size=2, num_nodes=6)
    # b's odd third node and a's fifth are left over: never a partial segment
    assert selected == ["b1", "b2", "a10", "a11", "a12", "a13"]
    assert remaining == ["a14", "c20", "c21", "c22", "c23", "cpu", "b3"]
    constraints, left, topology = prepare_segment_topology(2, 6, topology=_topology())
    assert constraints == [{B: 0.001}] * 2 + [{A: 0.001}] * 4
    assert left == remaining and topology == _topology()


def test_a_domain_too_small_for_a_segment_is_skipped():
    selected, _ = select_segment_nodes(_topology(), segment_size=4, num_nodes=8)
    assert selected == ["a10", "a11", "a12", "a13", "c20", "c21", "c22", "c23"]


def test_num_nodes_not_a_multiple_of_segment_size_names_the_keys():
    with pytest.raises(SegmentPlacementError) as error:
        select_segment_nodes(_topology(), segment_size=4, num_nodes=6)
    assert isinstance(error.value, ValueError) and isinstance(error.value, UserInputError)
    assert str(error.value) == (
        "cluster.segment_size: cluster.num_nodes=6 is not a multiple of segment_size=4 (the nodes are placed in "
        "whole segments of one NVLink domain each)"
    )


def test_not_enough_whole_segments_names_nodes_per_domain():
    with pytest.raises(SegmentPlacementError) as error:
        select_segment_nodes(_topology(), segment_size=4, num_nodes=12)
    assert str(error.value) == (
        "cluster.segment_size: cluster.num_nodes=12 training nodes need 3 whole segment(s) of 4 nodes of one NVLink "
        "domain each, and the free nodes form 2; nodes per domain: {nvlink_domain_b: 3, nvlink_domain_a: 5, "
        "nvlink_domain_c: 4}, 1 without a domain"
    )


def test_without_domains_one_line_and_no_constraints(capsys):
    topology = {"n0": (NVLINK_DOMAIN_UNKNOWN, 1), "n1": (NVLINK_DOMAIN_UNKNOWN, TOPO_RANK_UNKNOWN)}
    assert prepare_segment_topology(4, 6, topology=topology) == (None, ["n0", "n1"], topology)
    assert capsys.readouterr().out == NO_DOMAIN_LINE
    placement = SegmentPlacement(4, topology)
    assert placement.take(6) is None
    assert placement.take(2, "generation") is None
    assert capsys.readouterr().out == NO_DOMAIN_LINE  # once per run, not per cluster


def test_null_segment_size_reads_no_topology(monkeypatch, capsys):
    def no_ray():
        raise AssertionError("segment_size null must not read the Ray cluster")

    monkeypatch.setattr(segment_topology, "get_ray_cluster_topology", no_ray)
    assert prepare_segment_topology(None, 8) == (None, [], {})
    assert SegmentPlacement(None).take(8) is None
    assert capsys.readouterr().out == ""


def test_a_second_cluster_takes_its_segments_from_the_nodes_left(capsys):
    placement = SegmentPlacement(2, _topology())
    assert placement.take(6) == [{B: 0.001}] * 2 + [{A: 0.001}] * 4
    assert placement.take(4, "generation", "policy.generation.colocated.resources.num_nodes") == [{C: 0.001}] * 4
    assert capsys.readouterr().out == (
        "cluster.segment_size=2: 6 training nodes in 3 segment(s) on 2 NVLink domain(s)\n"
        "cluster.segment_size=2: 4 generation nodes in 2 segment(s) on 1 NVLink domain(s)\n"
    )
    with pytest.raises(SegmentPlacementError, match=r"resources.num_nodes=2 generation nodes need 1 whole segment"):
        placement.take(2, "generation", "policy.generation.colocated.resources.num_nodes")


def test_topology_from_ray_nodes_records():
    nodes = [
        {"NodeID": "n1", "Alive": True, "Resources": {"CPU": 8.0, A: 1.0, "topo_rank": 5.0}},
        {"NodeID": "n2", "Alive": True, "Resources": {"CPU": 8.0}},
        {"NodeID": "gone", "Alive": False, "Resources": {B: 1.0, "topo_rank": 1.0}},
    ]
    assert topology_from_nodes(nodes) == {"n1": (A, 5), "n2": (NVLINK_DOMAIN_UNKNOWN, TOPO_RANK_UNKNOWN)}


def test_ranks_follow_domain_then_topo_rank_and_partial_segments_are_found():
    topology = _topology()
    # logical nodes as reserved: a12, b2, a10, b1 → b (lowest rank 1) first, then a
    assert topology_ranks(["a12", "b2", "a10", "b1"], topology) == [3, 1, 2, 0]
    assert partial_segments(["a12", "b2", "a10", "b1"], topology, 2) == {}
    assert partial_segments(["a12", "b2", "a10"], topology, 2) == {B: 1}
    assert partial_segments(["x", "y"], {}, 2) == {}  # no domain known: nothing to check


@pytest.mark.parametrize(
    ("segment_size", "num_nodes"), [(None, 1), (16, 16), (16, 1), (8, 32), (2, 4), (4, 8), (2, 8), (16, 3)]
)
def test_cluster_config_accepts_the_recipes_values(segment_size, num_nodes):
    # divisibility is checked at start-up, where the nodes report domains, not in the config
    assert ClusterConfig(num_nodes=num_nodes, segment_size=segment_size).check() == []


def test_cluster_config_refuses_a_segment_below_one():
    assert ClusterConfig(segment_size=0).check() == [("segment_size", "must be >= 1, got 0")]


def test_every_run_cluster_gets_its_segments_through_ray_cluster(monkeypatch, capsys):
    from nemo_rl_clone.algorithms.run import setup
    from nemo_rl_clone.distributed import virtual_cluster

    built: list[dict] = []
    monkeypatch.setattr(virtual_cluster, "init_ray", lambda: None)
    monkeypatch.setattr(virtual_cluster, "RayVirtualCluster", lambda bundles, **options: built.append(options))
    section = ClusterConfig(gpus_per_node=4, num_nodes=6, segment_size=2)
    placement = SegmentPlacement(2, _topology())
    setup.ray_cluster(section, "train", False, 4, 6, placement=placement)
    setup.ray_cluster(section, "generation", False, 4, 4, placement=placement, role="generation")
    assert [options["node_resource_constraints"] for options in built] == [
        [{B: 0.001}] * 2 + [{A: 0.001}] * 4,
        [{C: 0.001}] * 4,  # from the nodes training left
    ]
    assert [options["segment_size"] for options in built] == [2, 2]
    setup.ray_cluster(ClusterConfig(), "plain", False, 1, 1)  # segment_size null: Ray's topology is not read
    assert built[-1]["node_resource_constraints"] is None
