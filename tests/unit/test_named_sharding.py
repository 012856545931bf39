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
    np.testing.assert_array_equal(dp2_tp2.get_ranks(data_parallel=1), [2, 3])
    np.testing.assert_array_equal(dp2_tp2.get_ranks(tensor_parallel=1), [1, 3])
    np.testing.assert_array_equal(dp2_tp2.get_ranks(), [[0, 1], [2, 3]])


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
    assert sub.shape == (2, 4)
    np.testing.assert_array_equal(sub, layout[:, 2, :])


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
        ([[0, 1], [1, 3]], DP_TP, r"missing \[2\], duplicated \[1\]"),
        ([[0, 1], [2, 4]], DP_TP, r"missing \[3\]"),
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
    with pytest.raises(ValueError, match="data_parallel=2 is out of range: axis 'data_parallel' has size 2"):
        dp2_tp2.get_ranks(data_parallel=2)
    with pytest.raises(ValueError, match="data_parallel=-1 is out of range"):
        dp2_tp2.get_ranks(data_parallel=-1)
    with pytest.raises(ValueError, match=r"rank 4 is outside .* ranks 0..3"):
        dp2_tp2.get_worker_coords(4)
    with pytest.raises(TypeError):
        dp2_tp2.get_worker_coords(1.5)  # type: ignore[arg-type]
