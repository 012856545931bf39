"""The data plane on a real TransferQueue (controller and storage units as Ray actors of the test cluster): rows come
back exactly as written, in the order asked, columns added later included; a worker reads its rows by key and only
a writer rank writes its results; what validation refuses. The GRPO runs through it are
test_grpo.py::test_previous_policy_logprobs_and_kl_penalty and NeMo-RL's run_grpo.py (test_nemo_rl_entry_scripts)."""

from __future__ import annotations

import pytest
import ray
import torch

from nemo_rl_clone.algorithms.grpo.config import DataPlaneConfig
from nemo_rl_clone.data_plane import KVBatchMeta, build_data_plane_client
from nemo_rl_clone.data_plane.worker_mixin import MICROBATCH_PLAN, PREV_LOGPROBS, WRITER_RANKS
from nemo_rl_clone.utils.errors import UserInputError
from tests.unit.ray_test_actors import DataPlaneReader

CFG = {"enabled": True, "impl": "transfer_queue", "backend": "simple", "num_storage_units": 2, "storage_capacity": 64}


@pytest.fixture(scope="module")
def queue(ray_local):
    client = build_data_plane_client(CFG, bootstrap=True)
    try:
        client.wait_until_started()
        yield client
    finally:
        client.close()


def _rows(n: int = 6, width: int = 5) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "input_ids": torch.randint(0, 1000, (n, width), generator=generator),
        "advantages": torch.randn(n, width, generator=generator),
        "sample_mask": torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 1.0])[:n],
        "routed_experts": torch.randint(-1, 8, (n, width, 2, 3), generator=generator, dtype=torch.int32),
    }


def test_rows_come_back_exactly_in_the_order_asked(queue):
    rows = _rows()
    keys = [f"1_{i}" for i in range(6)]
    queue.put_samples(keys, "train", rows)
    order = [4, 0, 5, 2]
    got = queue.get_samples([keys[i] for i in order], "train", sorted(rows))
    for name, value in rows.items():
        assert got[name].dtype == value.dtype and torch.equal(got[name], value[order]), name
    # a column written later for some rows is read with the others
    queue.put_samples(keys[:3], "train", {PREV_LOGPROBS: torch.full((3, 5), -0.25)})
    both = queue.get_samples(keys[1:3], "train", ["input_ids", PREV_LOGPROBS])
    assert torch.equal(both["input_ids"], rows["input_ids"][1:3])
    assert torch.equal(both[PREV_LOGPROBS], torch.full((2, 5), -0.25))
    queue.clear_samples(keys, "train")
    with pytest.raises(Exception):  # noqa: B017  (TransferQueue's own error for keys it does not hold)
        queue.get_samples(keys[:1], "train", ["input_ids"])


def test_a_worker_reads_its_rows_and_only_a_writer_rank_writes(queue):
    rows = _rows()
    keys = [f"2_{i}" for i in range(6)]
    queue.put_samples(keys, "train", rows)
    meta = KVBatchMeta("train", "train", keys, sorted(rows), [5] * 6)
    reader_class = ray.remote(num_cpus=0)(DataPlaneReader)
    readers = [reader_class.remote(rank) for rank in (0, 1)]
    ray.get([reader.setup_data_plane.remote(CFG) for reader in readers])
    first, second = meta.subset([0, 1, 2]), meta.subset([5, 4, 3])
    first.extra_info |= {MICROBATCH_PLAN: "plan of rank 0", WRITER_RANKS: [0]}
    second.extra_info[WRITER_RANKS] = [0]
    fetched = ray.get(readers[0].fetch.remote(first))
    assert torch.equal(fetched["columns"]["input_ids"], rows["input_ids"][:3]) and fetched["plan"] == "plan of rank 0"
    # rank 1 is not a writer: its computed values must not land
    ray.get([readers[0].logprobs.remote(first), readers[1].logprobs.remote(second)])
    written = queue.get_samples(keys[:3], "train", [PREV_LOGPROBS])[PREV_LOGPROBS]
    assert torch.equal(written, rows["input_ids"][:3].float() * 2)
    with pytest.raises(Exception):  # noqa: B017  (rows 3-5 have no such column)
        queue.get_samples(keys[3:], "train", [PREV_LOGPROBS])
    queue.clear_samples(keys, "train")
    for reader in readers:
        ray.kill(reader)


def test_a_second_queue_on_the_same_cluster_is_refused_in_one_line(queue):
    with pytest.raises(UserInputError, match=r"^data_plane.enabled: a TransferQueue controller already runs"):
        build_data_plane_client(CFG, bootstrap=True)


def test_meta_subsets_keep_keys_lengths_and_tags_together():
    meta = KVBatchMeta("train", "train", ["a", "b", "c"], ["input_ids"], [3, 1, 2], tags=[{"i": 0}, {"i": 1}, {"i": 2}])
    part = meta.subset([2, 0])
    assert (part.sample_ids, part.sequence_lengths, part.tags) == (["c", "a"], [2, 3], [{"i": 2}, {"i": 0}])
    joined = KVBatchMeta.concat(meta.slice(0, 1), meta.slice(1, 3))
    assert joined.sample_ids == meta.sample_ids and joined.sequence_lengths == meta.sequence_lengths
    joined.stamp_tags({"step": 4})
    assert joined.tags[1] == {"i": 1, "step": 4}
    with pytest.raises(ValueError, match="one partition"):
        KVBatchMeta.concat(meta, KVBatchMeta("val"))


@pytest.mark.parametrize(
    ("section", "key", "says"),
    [
        ({"backend": "mooncake_cpu"}, "backend", "not supported yet: TransferQueue's Mooncake store"),
        ({"backend": "redis"}, "backend", "'redis' is not a TransferQueue backend"),
        ({"impl": "nixl"}, "impl", "'nixl' is not a data plane"),
        ({"num_storage_units": 0}, "num_storage_units", "must be at least 1"),
        ({"claim_meta_poll_interval_s": 0.1}, "claim_meta_poll_interval_s", "not supported yet: workers claiming"),
    ],
)
def test_what_validation_refuses(section, key, says):
    problems = dict(DataPlaneConfig(enabled=True, **section).check())
    assert says in problems[key], problems
    assert DataPlaneConfig(enabled=True).check() == []
    assert DataPlaneConfig(enabled=False, backend="mooncake_cpu").check() == []  # NeMo-RL's disabled sections pass
