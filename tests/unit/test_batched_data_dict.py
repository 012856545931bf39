import pickle
import random
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict, SlicedDataDict

ALGORITHMS = ["first_fit_decreasing", "modified_first_fit_decreasing"]


def make_batch(lengths: list[int], width: int | None = None) -> BatchedDataDict:
    """Rows of token ids 1000*i + position up to each length, padded with -1; plus a list and a float key."""
    width = width or max(lengths, default=1)
    ids = torch.full((len(lengths), width), -1, dtype=torch.long)
    for i, length in enumerate(lengths):
        ids[i, :length] = 1000 * i + torch.arange(length)
    return BatchedDataDict(
        input_ids=ids,
        input_lengths=torch.tensor(lengths, dtype=torch.long),
        sample_id=[f"s{i}" for i in range(len(lengths))],
        reward=torch.arange(len(lengths), dtype=torch.float32),
    )


def dynamic_args(max_tokens: int, round_to: int = 1) -> dict:
    return {
        "input_key": "input_ids",
        "input_lengths_key": "input_lengths",
        "max_tokens_per_microbatch": max_tokens,
        "sequence_length_round": round_to,
    }


def packing_args(max_tokens: int, algorithm: str) -> dict:
    return {
        "input_key": "input_ids",
        "input_lengths_key": "input_lengths",
        "max_tokens_per_microbatch": max_tokens,
        "algorithm": algorithm,
    }


def sample_numbers(batch: BatchedDataDict) -> list[int]:
    return [int(s[1:]) for s in batch["sample_id"]]


# ------------------------------------------------------------------ NeMo-RL call forms
def test_nemo_rl_docstring_sharding_example_gives_sliced_dicts() -> None:
    batch = BatchedDataDict({"problem_id": [0, 0, 1, 1, 2, 2, 3, 3], "arbitrary_data": [1, 2, 3, 4, 5, 6, 7, 8]})
    shards = batch.shard_by_batch_size(shards=2)
    assert isinstance(shards, list) and all(type(shard) is SlicedDataDict for shard in shards)
    assert shards == [
        {"problem_id": [0, 0, 1, 1], "arbitrary_data": [1, 2, 3, 4]},
        {"problem_id": [2, 2, 3, 3], "arbitrary_data": [5, 6, 7, 8]},
    ]
    shards = batch.shard_by_batch_size(shards=2, batch_size=4)
    assert shards == [
        {"problem_id": [0, 0, 2, 2], "arbitrary_data": [1, 2, 5, 6]},
        {"problem_id": [1, 1, 3, 3], "arbitrary_data": [3, 4, 7, 8]},
    ]
    uneven = BatchedDataDict({"problem_id": [0, 1, 2, 3, 4], "arbitrary_data": [10, 11, 12, 13, 14]})
    assert uneven.shard_by_batch_size(shards=2, allow_uneven_shards=True) == [
        {"problem_id": [0, 1, 2], "arbitrary_data": [10, 11, 12]},
        {"problem_id": [3, 4], "arbitrary_data": [13, 14]},
    ]


def test_sliced_types_and_subscripted_annotations() -> None:
    batch = make_batch([3, 1, 2, 4])
    assert type(batch.slice(0, 2)) is SlicedDataDict
    assert type(batch.chunk(rank=1, chunks=2)) is SlicedDataDict
    assert type(batch.get_batch(batch_idx=1, batch_size=2)) is SlicedDataDict
    assert all(type(mb) is SlicedDataDict for mb in batch.make_microbatch_iterator(2))
    assert type(batch.select_indices([0])) is BatchedDataDict and type(batch.repeat_interleave(2)) is BatchedDataDict
    sliced = batch.slice(0, 4)
    assert type(sliced.select_indices([1])) is SlicedDataDict and type(sliced.copy()) is SlicedDataDict
    assert type(SlicedDataDict.from_batches([batch, batch])) is SlicedDataDict
    assert BatchedDataDict[dict].from_batches([batch]).size == 4  # a type argument, as NeMo-RL annotations use
    assert batch.data is batch and batch.get_dict() is batch
    batch.data["extra"] = [0, 1, 2, 3]
    assert batch["extra"] == [0, 1, 2, 3]


def test_truncate_tensors_and_multimodal_dict() -> None:
    batch = make_batch([3, 1])
    batch["token_type_ids"] = torch.zeros(2, 3, dtype=torch.long)
    assert set(batch.get_multimodal_dict()) == {"token_type_ids"}
    assert batch.get_multimodal_dict(device="cpu")["token_type_ids"].shape == (2, 3)
    batch.truncate_tensors(dim=1, truncated_len=2)
    assert batch["input_ids"].tolist() == [[0, 1], [1000, -1]]
    assert batch["token_type_ids"].shape == (2, 2) and batch["reward"].shape == (2,)  # 1-D tensors untouched
    with pytest.raises(ValueError, match=r"'input_ids' has 2 entries along dim 1, fewer than truncated_len=5"):
        batch.truncate_tensors(dim=1, truncated_len=5)


def test_nemo_rl_dynamic_batching_iteration_per_global_batch() -> None:
    batch = make_batch([3, 1, 2, 4, 4, 2, 1, 3])
    shards, order = batch.shard_by_batch_size(shards=2, batch_size=4, dynamic_batching_args=dynamic_args(4))
    assert all(type(shard) is SlicedDataDict for shard in shards) and sorted(order) == list(range(8))
    for shard in shards:
        for batch_idx in range(2):
            gb = shard.get_batch(batch_idx)  # batch_size comes from the plan
            assert type(gb) is SlicedDataDict and gb.size == 2
            microbatches = list(gb.make_microbatch_iterator_with_dynamic_shapes(sequence_dim=1))
            assert len(microbatches) == gb.get_microbatch_iterator_dynamic_shapes_len()
            for mb, length in zip(microbatches, gb.micro_batch_lengths[0], strict=True):
                assert mb["input_ids"].shape[1] == length and mb.size * length <= 4
            assert [sample_numbers(mb) for mb in microbatches] == [
                sample_numbers(gb.slice(s, e)) for s, e in gb.micro_batch_indices[0]
            ]


@pytest.mark.parametrize("name", ["sequence_length_pad_multiple", "sequence_length_round"])
def test_nemo_rl_sequence_packing_args(name: str) -> None:
    batch = make_batch([3, 1, 2, 4])
    args = {**packing_args(8, "modified_first_fit_decreasing"), name: 2}
    shards, order = batch.shard_by_batch_size(shards=2, sequence_packing_args=args)
    assert sorted(order) == [0, 1, 2, 3]
    for shard in shards:
        bins, largest = shard.get_microbatch_iterator_for_packable_sequences_len()
        assert bins == len(list(shard.make_microbatch_iterator_for_packable_sequences()))
        assert largest == max(shard.micro_batch_lengths[0]) <= 8
        assert shard.elem_counts_per_gb == [shard.size]
        # each sample costs its length rounded up to 2
        lengths = shard["input_lengths"].tolist()
        for (start, end), tokens in zip(shard.micro_batch_indices[0], shard.micro_batch_lengths[0], strict=True):
            assert tokens == sum((n + 1) // 2 * 2 for n in lengths[start:end])
    with pytest.raises(ValueError, match="sequence_length_round=4 and its other name sequence_length_pad_multiple=2"):
        batch.shard_by_batch_size(
            2, sequence_packing_args={**args, "sequence_length_pad_multiple": 2, "sequence_length_round": 4}
        )
    assert make_batch([1]).elem_counts_per_gb is None


# ------------------------------------------------------------------ construction and validation
def test_construction_and_size() -> None:
    batch = make_batch([3, 1, 2])
    assert batch.size == 3 and isinstance(batch, dict)
    assert BatchedDataDict().size == 0
    assert BatchedDataDict(a=[]).size == 0


def test_unequal_lengths_error_names_keys() -> None:
    with pytest.raises(ValueError, match="same length along dim 0, got ids=3, text=2"):
        BatchedDataDict(ids=torch.zeros(3, 2), text=["a", "b"])
    batch = BatchedDataDict(ids=torch.zeros(3, 2))
    batch["mask"] = torch.ones(4)  # key-by-key assignment is not checked ...
    with pytest.raises(ValueError, match="ids=3, mask=4"):  # ... but the next operation is
        batch.slice(0, 1)


def test_invalid_value_types() -> None:
    with pytest.raises(TypeError, match=r"BatchedDataDict\['x'\] must be a torch.Tensor .* got Tensor with shape \(\)"):
        BatchedDataDict(x=torch.tensor(1.0))
    with pytest.raises(TypeError, match=r"BatchedDataDict\['y'\] .* got tuple"):
        BatchedDataDict(y=(1, 2))


def test_pickle_keeps_type_values_and_plan() -> None:
    shards, _ = make_batch([3, 1, 2, 4]).shard_by_batch_size(2, dynamic_batching_args=dynamic_args(8))
    clone = pickle.loads(pickle.dumps(shards[1]))
    assert type(clone) is SlicedDataDict
    assert clone.microbatch_plan == shards[1].microbatch_plan
    assert torch.equal(clone["input_ids"], shards[1]["input_ids"]) and clone["sample_id"] == shards[1]["sample_id"]


def test_copy_is_shallow_and_keeps_plan() -> None:
    shards, _ = make_batch([3, 1]).shard_by_batch_size(1, dynamic_batching_args=dynamic_args(8))
    clone = shards[0].copy()
    assert type(clone) is SlicedDataDict and clone.microbatch_plan is shards[0].microbatch_plan
    clone["extra"] = [1, 2]
    assert "extra" not in shards[0]
    assert clone["input_ids"] is shards[0]["input_ids"]


def test_to_moves_tensors_only() -> None:
    batch = make_batch([2, 1])
    assert batch.to("meta") is batch
    assert batch["input_ids"].device.type == "meta" and batch["reward"].device.type == "meta"
    assert batch["sample_id"] == ["s0", "s1"]


# ------------------------------------------------------------------ from_batches
def test_from_batches_pads_per_key_and_concatenates_lists() -> None:
    a = BatchedDataDict(ids=torch.tensor([[1, 2]]), mask=torch.tensor([[True, True]]), text=["a"])
    b = BatchedDataDict(
        ids=torch.tensor([[3, 4, 5], [6, 7, 8]]), mask=torch.ones(2, 3, dtype=torch.bool), text=["b", "c"]
    )
    merged = BatchedDataDict.from_batches([a, b], pad_value_dict={"ids": 99})
    assert merged.size == 3
    assert merged["ids"].tolist() == [[1, 2, 99], [3, 4, 5], [6, 7, 8]]
    assert merged["mask"].tolist() == [[True, True, False], [True] * 3, [True] * 3]  # default pad 0 → False
    assert merged["text"] == ["a", "b", "c"]


def test_from_batches_pads_every_trailing_dim_and_promotes_dtype() -> None:
    a = {"x": torch.ones(1, 2, 1, dtype=torch.int32)}
    b = {"x": torch.full((1, 1, 3), 2.5)}
    merged = BatchedDataDict.from_batches([a, b], pad_value_dict={"x": -1})
    expected = torch.tensor([[[1, -1, -1], [1, -1, -1]], [[2.5, 2.5, 2.5], [-1, -1, -1]]])
    assert merged["x"].dtype == torch.float32
    torch.testing.assert_close(merged["x"], expected, rtol=0, atol=0)


def test_from_batches_same_shapes_is_plain_concat_and_empty_input() -> None:
    merged = BatchedDataDict.from_batches([make_batch([2, 2]), make_batch([1, 2])])
    assert merged["input_ids"].shape == (4, 2) and merged["sample_id"] == ["s0", "s1", "s0", "s1"]
    assert BatchedDataDict.from_batches([]) == {}


def test_from_batches_errors() -> None:
    with pytest.raises(ValueError, match=r"batch 1 has different keys .* missing \['b'\], unexpected \['c'\]"):
        BatchedDataDict.from_batches([{"a": [1], "b": [2]}, {"a": [1], "c": [2]}])
    with pytest.raises(TypeError, match=r"key 'a' mixes value types across batches: \['Tensor', 'list'\]"):
        BatchedDataDict.from_batches([{"a": torch.zeros(1)}, {"a": [1]}])
    with pytest.raises(ValueError, match="key 'a' has tensors of different ndim"):
        BatchedDataDict.from_batches([{"a": torch.zeros(1)}, {"a": torch.zeros(1, 2)}])
    with pytest.raises(ValueError, match="a=2, b=1"):
        BatchedDataDict.from_batches([{"a": [1, 2], "b": [1]}])


# ------------------------------------------------------------------ selection
def test_slice_returns_views_and_checks_bounds() -> None:
    batch = make_batch([1, 2, 3, 4])
    part = batch.slice(1, 3)
    assert sample_numbers(part) == [1, 2] and part["input_ids"].data_ptr() == batch["input_ids"][1].data_ptr()
    assert batch.slice(2, 2).size == 0
    for start, end in [(-1, 2), (3, 2), (0, 5)]:
        with pytest.raises(IndexError, match=rf"slice\({start}, {end}\) is out of range for a batch of size 4"):
            batch.slice(start, end)


def test_select_indices_with_repeats_and_tensor_indices() -> None:
    batch = make_batch([1, 2, 3])
    picked = batch.select_indices([2, 0, 2])
    assert sample_numbers(picked) == [2, 0, 2]
    assert picked["input_ids"][0].tolist() == batch["input_ids"][2].tolist()
    assert sample_numbers(batch.select_indices(torch.tensor([1]))) == [1]
    assert batch.select_indices([]).size == 0
    with pytest.raises(IndexError, match="index 3 at position 1 is out of range for a batch of size 3"):
        batch.select_indices([0, 3])
    with pytest.raises(IndexError, match="index -1 at position 0"):
        batch.select_indices([-1])


def test_reorder_data_inverts_select_indices() -> None:
    batch = make_batch([4, 1, 3, 2, 5])
    order = [3, 0, 4, 1, 2]
    permuted = batch.select_indices(order)
    permuted.reorder_data(order)
    assert sample_numbers(permuted) == [0, 1, 2, 3, 4]
    assert torch.equal(permuted["input_ids"], batch["input_ids"])
    with pytest.raises(ValueError, match=r"permutation of range\(5\), got \[0, 0, 1, 2, 3\]"):
        permuted.reorder_data([0, 0, 1, 2, 3])
    with pytest.raises(ValueError, match=r"permutation of range\(5\)"):
        permuted.reorder_data([0, 1])


def test_chunk_is_contiguous_and_balanced() -> None:
    batch = make_batch([1] * 10)
    assert [sample_numbers(batch.chunk(r, 3)) for r in range(3)] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert batch.chunk(0, 1).size == 10
    with pytest.raises(ValueError, match=r"chunk\(rank=3, chunks=3\)"):
        batch.chunk(3, 3)


def test_get_batch() -> None:
    batch = make_batch([1] * 6)
    assert sample_numbers(batch.get_batch(1, 2)) == [2, 3]
    with pytest.raises(IndexError, match=r"get_batch\(3, 2\) needs samples 6..7, batch has 6"):
        batch.get_batch(3, 2)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        batch.get_batch(0, 0)


def test_repeat_interleave_groups_adjacent_and_copies_lists() -> None:
    batch = BatchedDataDict(ids=torch.tensor([[1, 2], [3, 4]]), messages=[[{"role": "user"}], [{"role": "system"}]])
    repeated = batch.repeat_interleave(3)
    assert repeated["ids"].tolist() == [[1, 2]] * 3 + [[3, 4]] * 3
    assert repeated["messages"] == [[{"role": "user"}]] * 3 + [[{"role": "system"}]] * 3
    repeated["messages"][0].append({"role": "assistant"})  # a rollout extends one sample's message log
    assert len(repeated["messages"][1]) == 1 and len(batch["messages"][0]) == 1
    with pytest.raises(ValueError, match="num_repeats must be >= 1, got 0"):
        batch.repeat_interleave(0)


def test_make_microbatch_iterator_yields_last_partial() -> None:
    batch = make_batch([1] * 5)
    assert [sample_numbers(mb) for mb in batch.make_microbatch_iterator(2)] == [[0, 1], [2, 3], [4]]
    assert list(BatchedDataDict(a=[]).make_microbatch_iterator(2)) == []
    with pytest.raises(ValueError, match="microbatch_size must be >= 1"):
        next(batch.make_microbatch_iterator(0))


# ------------------------------------------------------------------ plain sharding
def test_shard_by_batch_size_gives_each_shard_its_piece_of_every_global_batch() -> None:
    shards = make_batch([1] * 8).shard_by_batch_size(2, batch_size=4)
    assert [sample_numbers(s) for s in shards] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert shards[1]["reward"].tolist() == [2.0, 3.0, 6.0, 7.0]
    whole = make_batch([1] * 8).shard_by_batch_size(4)
    assert [sample_numbers(s) for s in whole] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_shard_by_batch_size_uneven() -> None:
    shards = make_batch([1] * 10).shard_by_batch_size(4, batch_size=5, allow_uneven_shards=True)
    assert [sample_numbers(s) for s in shards] == [[0, 1, 5, 6], [2, 7], [3, 8], [4, 9]]
    with pytest.raises(ValueError, match="batch_size=5 is not divisible by shards=4; pass allow_uneven_shards=True"):
        make_batch([1] * 10).shard_by_batch_size(4, batch_size=5)


def test_shard_by_batch_size_errors() -> None:
    batch = make_batch([1] * 6)
    with pytest.raises(ValueError, match="batch of 6 samples is not a whole number of global batches of batch_size=4"):
        batch.shard_by_batch_size(2, batch_size=4)
    with pytest.raises(ValueError, match="shards must be >= 1"):
        batch.shard_by_batch_size(0)
    with pytest.raises(ValueError, match="not both"):
        batch.shard_by_batch_size(2, dynamic_batching_args=dynamic_args(8), sequence_packing_args=packing_args(8, "x"))


def test_shard_empty_batch() -> None:
    empty = make_batch([1, 2]).slice(0, 0)
    shards = empty.shard_by_batch_size(3)
    assert len(shards) == 3
    assert all(s.size == 0 and s["input_ids"].shape == (0, 2) and s["sample_id"] == [] for s in shards)
    dyn_shards, order = empty.shard_by_batch_size(2, batch_size=4, dynamic_batching_args=dynamic_args(8))
    assert order == [] and [s.micro_batch_indices for s in dyn_shards] == [[], []]
    assert list(dyn_shards[0].make_microbatch_iterator_with_dynamic_shapes()) == []
    assert BatchedDataDict().shard_by_batch_size(2) == [{}, {}]


# ------------------------------------------------------------------ dynamic batching
def check_token_bounded_shards(
    batch: BatchedDataDict, shards: list[BatchedDataDict], order: list[int], max_tokens: int, kind: str
) -> None:
    """Invariants shared by dynamic batching and packing; recomputed from the data, not from the planner."""
    lengths = batch["input_lengths"].tolist()
    assert sorted(order) == list(range(batch.size))  # every sample exactly once
    counts = {tuple(len(mbs) for mbs in s.micro_batch_indices) for s in shards}
    assert len(counts) == 1  # same number of microbatches per global batch on every shard
    iterate = (
        "make_microbatch_iterator_with_dynamic_shapes"
        if kind == "dynamic"
        else "make_microbatch_iterator_for_packable_sequences"
    )
    seen = []
    for shard in shards:
        microbatches = list(getattr(shard, iterate)())
        assert len(microbatches) == sum(len(mbs) for mbs in shard.micro_batch_indices)
        for mb in microbatches:
            numbers = sample_numbers(mb)
            seen += numbers
            if kind == "dynamic":
                padded = len(numbers) * mb["input_ids"].shape[1]
                assert padded <= max_tokens, (numbers, mb["input_ids"].shape)
            else:
                assert sum(lengths[n] for n in numbers) <= max_tokens
            for row, n in enumerate(numbers):  # every real token survives truncation
                assert torch.equal(mb["input_ids"][row, : lengths[n]], batch["input_ids"][n, : lengths[n]])
    assert seen == order


def test_dynamic_batching_respects_token_bound_and_restores_order() -> None:
    rng = random.Random(0)
    lengths = [rng.randint(1, 30) for _ in range(48)]
    batch = make_batch(lengths, width=32)
    shards, order = batch.shard_by_batch_size(
        3, batch_size=24, dynamic_batching_args=dynamic_args(max_tokens=64, round_to=4)
    )
    check_token_bounded_shards(batch, shards, order, 64, "dynamic")
    for shard in shards:
        assert len(shard.micro_batch_indices) == 2 and shard.size == 16
        for mb in shard.make_microbatch_iterator_with_dynamic_shapes():
            assert mb["input_ids"].shape[1] % 4 == 0  # padded length rounded to sequence_length_round
            assert mb["reward"].ndim == 1 and mb["input_lengths"].ndim == 1
        # each global batch's piece of a shard comes from that global batch only
        first, second = shard.get_batch(0, 8), shard.get_batch(1, 8)
        assert all(n < 24 for n in sample_numbers(first)) and all(n >= 24 for n in sample_numbers(second))
        assert first.micro_batch_indices[0][0][0] == 0 and second.micro_batch_indices[0][-1][1] == 8
        assert len(list(second.make_microbatch_iterator_with_dynamic_shapes())) == len(shard.micro_batch_indices[1])

    # a worker computes a per-sample output; concatenated outputs are restored to input order
    outputs = [BatchedDataDict(total=s["input_ids"].clamp(min=0).sum(dim=1), sample_id=s["sample_id"]) for s in shards]
    merged = BatchedDataDict.from_batches(outputs)
    merged.reorder_data(order)
    assert merged["sample_id"] == batch["sample_id"]
    assert torch.equal(merged["total"], batch["input_ids"].clamp(min=0).sum(dim=1))


def test_dynamic_batching_hand_example_equalizes_by_splitting() -> None:
    # lengths sorted: s1=1, s3=3, s0=5, s2=8 → dealt shard0 [s1, s0], shard1 [s3, s2] (costs rounded to 2)
    batch = make_batch([5, 1, 8, 3])
    shards, order = batch.shard_by_batch_size(2, dynamic_batching_args=dynamic_args(max_tokens=12, round_to=2))
    assert order == [1, 0, 3, 2]
    # shard1: 2 * 8 > 12 → two microbatches; shard0 (2 * 6 = 12 fits in one) is split to match
    assert shards[0].micro_batch_indices == [[(0, 1), (1, 2)]] and shards[0].micro_batch_lengths == [[2, 6]]
    assert shards[1].micro_batch_indices == [[(0, 1), (1, 2)]] and shards[1].micro_batch_lengths == [[4, 8]]
    widths = [mb["input_ids"].shape for mb in shards[0].make_microbatch_iterator_with_dynamic_shapes()]
    assert widths == [(1, 2), (1, 6)]


def test_dynamic_batching_packs_multiple_samples_when_they_fit() -> None:
    shards, _ = make_batch([2, 2, 2, 2, 4, 4]).shard_by_batch_size(1, dynamic_batching_args=dynamic_args(8))
    assert shards[0].micro_batch_indices == [[(0, 4), (4, 6)]] and shards[0].micro_batch_lengths == [[2, 4]]


def test_dynamic_batching_uneven_shards_get_empty_microbatch() -> None:
    # shard0 gets two long samples that need a microbatch each; shard1 has one sample → one empty microbatch
    batch = make_batch([8, 1, 8])
    shards, order = batch.shard_by_batch_size(
        2, allow_uneven_shards=True, dynamic_batching_args=dynamic_args(max_tokens=8)
    )
    assert [s.size for s in shards] == [2, 1]
    assert shards[1].micro_batch_indices == [[(0, 1), (1, 1)]] and shards[1].micro_batch_lengths == [[8, 0]]
    sizes = [mb.size for mb in shards[1].make_microbatch_iterator_with_dynamic_shapes()]
    assert sizes == [1, 0]
    check_token_bounded_shards(batch, shards, order, 8, "dynamic")


def test_dynamic_batching_rejects_too_long_sample() -> None:
    with pytest.raises(ValueError, match=r"sample 2 has length 9 \(12 tokens after rounding .*=4\), .*=10"):
        make_batch([3, 4, 9]).shard_by_batch_size(1, dynamic_batching_args=dynamic_args(10, round_to=4))


def test_dynamic_batching_argument_errors() -> None:
    batch = make_batch([3, 4])
    typo = {**dynamic_args(8), "max_token_per_microbatch": 8}
    del typo["max_tokens_per_microbatch"]
    with pytest.raises(ValueError, match=r"unknown keys \['max_token_per_microbatch'\], missing keys \['max_tokens"):
        batch.shard_by_batch_size(1, dynamic_batching_args=typo)
    with pytest.raises(ValueError, match=r"\['max_tokens_per_microbatch'\] must be a positive int, got 0"):
        batch.shard_by_batch_size(1, dynamic_batching_args=dynamic_args(0))
    with pytest.raises(KeyError, match="needs key 'lens'"):
        batch.shard_by_batch_size(1, dynamic_batching_args={**dynamic_args(8), "input_lengths_key": "lens"})
    batch["input_lengths"] = torch.tensor([3, 5])
    with pytest.raises(ValueError, match=r"input_lengths\[1\] = 5 is outside 0..4"):
        batch.shard_by_batch_size(1, dynamic_batching_args=dynamic_args(8))
    with pytest.raises(ValueError, match=r"no dynamic microbatch plan \(found: none\)"):
        next(batch.make_microbatch_iterator_with_dynamic_shapes())


# ------------------------------------------------------------------ sequence packing through shard_by_batch_size
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_sequence_packing_shards(algorithm: str) -> None:
    rng = random.Random(1)
    lengths = [rng.randint(1, 40) for _ in range(64)]
    batch = make_batch(lengths, width=40)
    shards, order = batch.shard_by_batch_size(
        4, batch_size=32, sequence_packing_args=packing_args(max_tokens=96, algorithm=algorithm)
    )
    check_token_bounded_shards(batch, shards, order, 96, "packing")
    for shard in shards:
        totals = [[sum(shard["input_lengths"][s:e].tolist()) for s, e in mbs] for mbs in shard.micro_batch_indices]
        assert shard.micro_batch_lengths == totals
        for mb in shard.make_microbatch_iterator_for_packable_sequences():
            assert mb["input_ids"].shape[1] == max(mb["input_lengths"].tolist(), default=0)
    with pytest.raises(ValueError, match="no packing microbatch plan"):
        next(batch.make_microbatch_iterator_for_packable_sequences())
    merged = BatchedDataDict.from_batches(shards)
    merged.reorder_data(order)
    assert torch.equal(merged["input_ids"], batch["input_ids"])


def test_sequence_packing_keeps_row_groups_whole_and_in_order() -> None:
    """Preference pairs (rows 2k, 2k + 1): every bin holds whole pairs, chosen before rejected, within budget."""
    rng = random.Random(2)
    lengths = [rng.randint(1, 40) for _ in range(48)]
    batch = make_batch(lengths, width=40)
    shards, order = batch.shard_by_batch_size(
        2, batch_size=24, sequence_packing_args=packing_args(96, "modified_first_fit_decreasing"), rows_per_group=2
    )
    assert sorted(order) == list(range(48))
    for shard in shards:
        first_ids = shard["input_ids"][:, 0].tolist()  # row i starts with token 1000 * i
        for global_batch in shard.micro_batch_indices:
            assert len(global_batch) < sum(end - start for start, end in global_batch) / 2  # bins hold several pairs
            for start, end in global_batch:
                assert start % 2 == 0 and end % 2 == 0
                rows = [row // 1000 for row in first_ids[start:end]]
                assert all(rows[k] % 2 == 0 and rows[k + 1] == rows[k] + 1 for k in range(0, len(rows), 2)), rows
                assert sum(shard["input_lengths"][start:end].tolist()) <= 96
    merged = BatchedDataDict.from_batches(shards)
    merged.reorder_data(order)
    assert torch.equal(merged["input_ids"], batch["input_ids"])


def test_row_groups_that_fit_no_bin_or_split_are_refused() -> None:
    batch = make_batch([30, 40, 5, 5])
    with pytest.raises(ValueError, match=r"rows 0..1 \(one group of 2 that must share a microbatch\) need 70 tokens"):
        batch.shard_by_batch_size(1, sequence_packing_args=packing_args(64, "first_fit_decreasing"), rows_per_group=2)
    with pytest.raises(ValueError, match=r"the batch \(6 rows\) or the global batch \(3\) is not a whole number"):
        make_batch([1, 2, 3, 4, 5, 6]).shard_by_batch_size(
            1, batch_size=3, sequence_packing_args=packing_args(64, "first_fit_decreasing"), rows_per_group=2
        )
    with pytest.raises(ValueError, match="rows_per_group needs sequence_packing_args"):
        batch.shard_by_batch_size(1, rows_per_group=2)


def test_sequence_packing_unknown_algorithm() -> None:
    with pytest.raises(ValueError, match=r"\['algorithm'\] = 'best_fit' is unknown; choose one of \['first_fit"):
        make_batch([3]).shard_by_batch_size(1, sequence_packing_args=packing_args(8, "best_fit"))


# ------------------------------------------------------------------ all_gather over a real gloo group
def _all_gather_worker(rank: int, world_size: int, init_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        # rank r holds r+1 samples of width r+2: the gather must pad to width 3 with the per-key pad value
        local = BatchedDataDict(
            ids=torch.full((rank + 1, rank + 2), rank, dtype=torch.long), text=[f"r{rank}"] * (rank + 1)
        )
        gathered = local.all_gather(pad_value_dict={"ids": -7})
        assert gathered["text"] == ["r0", "r1", "r1"], gathered["text"]
        assert gathered["ids"].tolist() == [[0, 0, -7], [1, 1, 1], [1, 1, 1]], gathered["ids"].tolist()
        group = dist.new_group([0, 1])
        assert BatchedDataDict(ids=torch.tensor([rank])).all_gather(group)["ids"].tolist() == [0, 1]
        dist.barrier()  # no rank tears gloo down while the other is still inside a collective
    finally:
        dist.destroy_process_group()


def test_all_gather_two_ranks(tmp_path: Path) -> None:
    mp.spawn(_all_gather_worker, args=(2, str(tmp_path / "store")), nprocs=2, join=True)
