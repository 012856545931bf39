import pickle

import numpy as np
import pytest

from nemo_rl_clone.distributed.named_sharding import NamedSharding

DP_TP = ["data_parallel", "tensor_parallel"]


@pytest.fixture
def dp2_tp2() -> NamedSharding:
    return NamedSharding([[0, 1], [2, 3]], DP_TP)


def test_shape_names_and_sizes(dp2_tp2: NamedSharding) -> None:
    assert dp2_tp2.shape == {"data_parallel": 2, "tensor_parallel": 2}
    assert dp2_tp2.ndim == 2
    assert dp2_tp2.size == 4
    assert dp2_tp2.names == DP_TP
    assert dp2_tp2.get_axis_size("tensor_parallel") == 2
    np.testing.assert_array_equal(dp2_tp2.layout, [[0, 1], [2, 3]])


def test_worker_coords_row_major(dp2_tp2: NamedSharding) -> None:
    assert dp2_tp2.get_worker_coords(0) == {"data_parallel": 0, "tensor_parallel": 0}
    assert dp2_tp2.get_worker_coords(1) == {"data_parallel": 0, "tensor_parallel": 1}
    assert dp2_tp2.get_worker_coords(2) == {"data_parallel": 1, "tensor_parallel": 0}
    assert dp2_tp2.get_worker_coords(np.int64(3)) == {"data_parallel": 1, "tensor_parallel": 1}


def test_get_ranks_full_and_partial(dp2_tp2: NamedSharding) -> None:
    full = dp2_tp2.get_ranks(data_parallel=1, tensor_parallel=0)
    assert full == 2 and isinstance(full, int)
    tp_group = dp2_tp2.get_ranks(data_parallel=1)
    assert isinstance(tp_group, NamedSharding)
    assert tp_group.names == ["tensor_parallel"] and tp_group.shape == {"tensor_parallel": 2}
    np.testing.assert_array_equal(tp_group.layout, [2, 3])
    assert tp_group.get_worker_coords(3) == {"tensor_parallel": 1}
    assert tp_group.get_ranks(tensor_parallel=0) == 2
    assert dp2_tp2.get_ranks() == dp2_tp2


def test_non_row_major_3d_layout_round_trips() -> None:
    # ranks laid out in a shuffled order: coordinates must follow the layout, not rank arithmetic
    rng = np.random.default_rng(0)
    layout = rng.permutation(24).reshape(2, 3, 4)
    sharding = NamedSharding(layout, ["pipeline_parallel", "data_parallel", "tensor_parallel"])
    for rank in range(24):
        coords = sharding.get_worker_coords(rank)
        assert layout[coords["pipeline_parallel"], coords["data_parallel"], coords["tensor_parallel"]] == rank
        assert sharding.get_ranks(**coords) == rank
    sub = sharding.get_ranks(data_parallel=2)
    assert isinstance(sub, NamedSharding)
    assert sub.shape == {"pipeline_parallel": 2, "tensor_parallel": 4}
    np.testing.assert_array_equal(sub.layout, layout[:, 2, :])


def test_nemo_rl_style_queries_on_2x2x2() -> None:
    # dp outermost, then pp, then tp: rank = 4 * dp + 2 * pp + tp
    cube = NamedSharding(np.arange(8).reshape(2, 2, 2), ["dp", "pp", "tp"])
    assert cube.get_axis_index("pp") == 1 and cube.get_axis_size("tp") == 2
    assert cube.get_ranks_by_coord(dp=1) == [4, 5, 6, 7]
    assert cube.get_ranks_by_coord(pp=0, tp=1) == [1, 5]
    assert cube.get_ranks_by_coord(dp=0, pp=1, tp=0) == [2]
    assert cube.get_ranks_by_coord() == list(range(8))
    assert cube.get_ranks_by_coord(dp=2) == []  # outside the axis: matches nothing
    pp_tp = cube.get_ranks(dp=1)
    assert isinstance(pp_tp, NamedSharding) and pp_tp.names == ["pp", "tp"]
    np.testing.assert_array_equal(pp_tp.layout, [[4, 5], [6, 7]])
    tp = pp_tp.get_ranks(pp=1)
    assert isinstance(tp, NamedSharding)
    np.testing.assert_array_equal(tp.layout, [6, 7])
    assert tp.contains_worker_id(7) and not tp.contains_worker_id(5)
    assert cube.get_ranks(dp=1, pp=0, tp=1) == 5
    assert NamedSharding.is_axis_zero(cube.get_worker_coords(1), ["dp", "pp"])
    assert not NamedSharding.is_axis_zero(cube.get_worker_coords(1), ["tp"])


def test_axis_groups(dp2_tp2: NamedSharding) -> None:
    assert dp2_tp2.get_axis_groups("data_parallel") == [[0, 2], [1, 3]]
    assert dp2_tp2.get_axis_groups("tensor_parallel") == [[0, 1], [2, 3]]
    cube = NamedSharding(np.arange(8).reshape(2, 2, 2), ["a", "b", "c"])
    assert cube.get_axis_groups("b") == [[0, 2], [1, 3], [4, 6], [5, 7]]


def test_layout_is_read_only(dp2_tp2: NamedSharding) -> None:
    with pytest.raises(ValueError, match="read-only"):
        dp2_tp2.layout[0, 0] = 5


def test_equality_hash_and_pickle(dp2_tp2: NamedSharding) -> None:
    clone = pickle.loads(pickle.dumps(dp2_tp2))
    assert clone == dp2_tp2 and hash(clone) == hash(dp2_tp2)
    assert clone.get_worker_coords(3) == {"data_parallel": 1, "tensor_parallel": 1}
    assert not clone.layout.flags.writeable
    assert NamedSharding([[0, 2], [1, 3]], DP_TP) != dp2_tp2
    assert NamedSharding([[0, 1], [2, 3]], ["x", "y"]) != dp2_tp2


@pytest.mark.parametrize(
    ("layout", "names", "message"),
    [
        ([[0, 1], [2, 3]], ["data_parallel"], "got 1 axis names .* ndim=2"),
        ([0, 1, 2], ["a", "b"], "got 2 axis names .* ndim=1"),
        ([[0, 1], [1, 3]], DP_TP, r"duplicated \[1\], negative \[\]"),
        ([[0, 1], [2, -4]], DP_TP, r"negative \[-4\]"),
        ([[0, 1], [2, 3]], ["dp", "dp"], "must be unique"),
        ([[0, 1], [2, 3]], ["dp", ""], "non-empty strings"),
        ([0.0, 1.0], ["dp"], "integer ranks"),
        ([], ["dp"], "non-empty"),
        (5, [], "ndim >= 1"),
    ],
)
def test_invalid_layouts(layout: object, names: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NamedSharding(layout, names)


def test_invalid_queries(dp2_tp2: NamedSharding) -> None:
    with pytest.raises(ValueError, match=r"unknown axis 'pipeline_parallel'; .* axes \['data_parallel'"):
        dp2_tp2.get_axis_size("pipeline_parallel")
    with pytest.raises(ValueError, match="unknown axis 'dp'"):
        dp2_tp2.get_ranks(dp=0)
    with pytest.raises(ValueError, match="unknown axis 'dp'"):
        dp2_tp2.get_ranks_by_coord(dp=0)
    with pytest.raises(ValueError, match="unknown axis 'dp'"):
        dp2_tp2.get_axis_index("dp")
    with pytest.raises(IndexError, match="data_parallel=2 is out of range: axis 'data_parallel' has size 2"):
        dp2_tp2.get_ranks(data_parallel=2)
    with pytest.raises(IndexError, match="data_parallel=-1 is out of range"):
        dp2_tp2.get_ranks(data_parallel=-1)
    with pytest.raises(ValueError, match=r"rank 4 is not in this NamedSharding \(ranks 0..3\)"):
        dp2_tp2.get_worker_coords(4)
    sub = dp2_tp2.get_ranks(data_parallel=1)
    assert isinstance(sub, NamedSharding)
    with pytest.raises(ValueError, match=r"rank 0 is not in this NamedSharding \(ranks \[2, 3\]\)"):
        sub.get_worker_coords(0)
    with pytest.raises(TypeError):
        dp2_tp2.get_worker_coords(1.5)  # type: ignore[arg-type]
