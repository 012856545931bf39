"""The packing algorithms of `distributed/sequence_packing.py` on their own: bins against an exhaustive optimum,
hand examples, errors, and the padded-microbatch cuts (their use through `BatchedDataDict.shard_by_batch_size` is
tested in test_batched_data_dict.py)."""

import random

import pytest

from nemo_rl_clone.distributed.sequence_packing import (
    cut_padded_microbatches,
    first_fit_decreasing,
    modified_first_fit_decreasing,
    pack_sequences,
    split_groups_to_count,
)

ALGORITHMS = ["first_fit_decreasing", "modified_first_fit_decreasing"]


# ------------------------------------------------------------------ packing algorithms
def optimal_bin_count(lengths: list[int], capacity: int) -> int:
    """Exact minimum by exhaustive search (tiny inputs only): an independent reference for the heuristics."""
    best = len(lengths)

    def place(i: int, loads: list[int]) -> None:
        nonlocal best
        if len(loads) >= best:
            return
        if i == len(lengths):
            best = len(loads)
            return
        for b in range(len(loads)):
            if loads[b] + lengths[i] <= capacity:
                loads[b] += lengths[i]
                place(i + 1, loads)
                loads[b] -= lengths[i]
        place(i + 1, [*loads, lengths[i]])

    place(0, [])
    return best


def check_bins(bins: list[list[int]], lengths: list[int], capacity: int) -> None:
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(b and sum(lengths[i] for i in b) <= capacity for b in bins)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_packing_invariants_and_quality_against_optimum(algorithm: str) -> None:
    rng = random.Random(2)
    for _ in range(150):
        capacity = rng.randint(10, 100)
        lengths = [rng.randint(0, capacity) for _ in range(rng.randint(0, 8))]
        bins = pack_sequences(lengths, capacity, algorithm)
        check_bins(bins, lengths, capacity)
        optimum = optimal_bin_count(lengths, capacity)
        # FFD <= 11/9 OPT + 6/9 and MFFD <= 71/60 OPT + 1 (Johnson & Garey); both imply this bound
        assert len(bins) <= 11 / 9 * optimum + 1
    big = [rng.randint(1, 512) for _ in range(2000)]
    check_bins(pack_sequences(big, 512, algorithm), big, 512)


def test_first_fit_decreasing_hand_example() -> None:
    # longest first: 6→b0, 5→b1, 4→b0 (full), 3→b1, 2→b1
    assert first_fit_decreasing([6, 5, 4, 3, 2], 10) == [[0, 2], [1, 3, 4]]


def test_modified_first_fit_decreasing_beats_ffd_on_hand_example() -> None:
    # C=100: large 68, 65 open bins; no medium (50) fits; backward pass pairs smalls 17+17 into 65's bin;
    # forward pass adds 27 to 68's bin; FFD packs the rest (50, 20, 19) into one bin → 3 bins, FFD needs 4.
    lengths = [19, 17, 20, 17, 65, 27, 50, 68]
    assert modified_first_fit_decreasing(lengths, 100) == [[7, 5], [4, 1, 3], [6, 2, 0]]
    assert len(first_fit_decreasing(lengths, 100)) == 4 == optimal_bin_count(lengths, 100) + 1


def test_packing_errors() -> None:
    with pytest.raises(ValueError, match="sample 1 needs 11 tokens, more than max_tokens_per_microbatch=10"):
        first_fit_decreasing([3, 11], 10)
    with pytest.raises(ValueError, match="sample 0 has negative length -1"):
        modified_first_fit_decreasing([-1], 10)
    with pytest.raises(ValueError, match="must be positive, got 0"):
        first_fit_decreasing([1], 0)
    with pytest.raises(ValueError, match="unknown sequence packing algorithm 'nfd'"):
        pack_sequences([1], 4, "nfd")


def test_cut_padded_microbatches_and_split_groups() -> None:
    # padded cost = count * longest: [1,2,2] costs 6; adding 3 would cost 12 > 8
    assert cut_padded_microbatches([1, 2, 2, 3, 4, 8], 8) == [[0, 1, 2], [3, 4], [5]]
    assert split_groups_to_count([[0, 1, 2, 3], [4]], 4) == [[0], [1], [2, 3], [4]]
    assert split_groups_to_count([[0, 1, 2, 3], [4]], 3) == [[0, 1], [2, 3], [4]]
    assert split_groups_to_count([[0, 1, 2], [3]], 5) == [[0], [1], [2], [3], []]
    assert split_groups_to_count([], 2) == [[], []]
    with pytest.raises(ValueError, match="cannot reduce 2 groups to 1"):
        split_groups_to_count([[0], [1]], 1)
