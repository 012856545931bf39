"""Token-bounded grouping of samples into microbatches: bin packing and length-sorted cutting.

All functions work on per-sample token costs and return groups of sample positions (indices into ``lengths``);
they never touch tensors. ``BatchedDataDict.shard_by_batch_size`` builds microbatches from these groups.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

Bins = list[list[int]]


def round_up(value: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``value``."""
    return -(-value // multiple) * multiple


def check_lengths_fit(lengths: Sequence[int], capacity: int) -> None:
    """Raise ``ValueError`` naming the first sample whose length is negative or exceeds ``capacity``."""
    if capacity <= 0:
        raise ValueError(f"bin capacity (max_tokens_per_microbatch) must be positive, got {capacity}")
    for index, length in enumerate(lengths):
        if length < 0:
            raise ValueError(f"sample {index} has negative length {length}")
        if length > capacity:
            raise ValueError(
                f"sample {index} needs {length} tokens, more than max_tokens_per_microbatch={capacity}; "
                f"raise max_tokens_per_microbatch or truncate/filter long samples"
            )


def first_fit(order: Sequence[int], lengths: Sequence[int], capacity: int) -> Bins:
    """Place items in ``order`` into the first bin with room, opening a new bin when none has (lengths are not
    checked: see `check_lengths_fit`)."""
    bins: Bins = []
    free = np.empty(len(order), dtype=np.int64)  # free capacity per bin; at most one bin per item
    for index in order:
        length = lengths[index]
        fitting = np.flatnonzero(free[: len(bins)] >= length)
        if fitting.size:
            target = int(fitting[0])
            bins[target].append(index)
            free[target] -= length
        else:
            bins.append([index])
            free[len(bins) - 1] = capacity - length
    return bins


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> Bins:
    """First-Fit Decreasing: longest first, each into the first bin with room (≤ 11/9 OPT + 6/9 bins).

    Returns:
        Bins as lists of indices into ``lengths``; every index appears exactly once and each bin's total length
        is <= ``capacity``. Ties are broken by index, so the result is deterministic.
    """
    check_lengths_fit(lengths, capacity)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return first_fit(order, lengths, capacity)


class _SortedItems:
    """Items kept sorted by (length, index) with removal; sizes here are small, so lists + bisect suffice."""

    def __init__(self, indices: Sequence[int], lengths: Sequence[int]) -> None:
        self._keys = sorted((lengths[i], i) for i in indices)

    def __bool__(self) -> bool:
        return bool(self._keys)

    def smallest_length(self) -> int:
        return self._keys[0][0]

    def smallest_pair_length(self) -> int | None:
        """Total length of the two smallest items, or None when fewer than two remain."""
        return self._keys[0][0] + self._keys[1][0] if len(self._keys) >= 2 else None

    def pop_smallest(self) -> tuple[int, int]:
        return self._keys.pop(0)

    def pop_largest_fitting(self, room: int) -> tuple[int, int] | None:
        position = bisect.bisect_right(self._keys, (room, float("inf"))) - 1
        return self._keys.pop(position) if position >= 0 else None

    def indices(self) -> list[int]:
        return [index for _, index in self._keys]


def modified_first_fit_decreasing(lengths: Sequence[int], capacity: int) -> Bins:
    """Modified First-Fit Decreasing (Johnson & Garey, 1985; ≤ 71/60 OPT + 1 bins).

    Items are classed by length relative to capacity C: large (> C/2), medium (C/3, C/2], small (C/6, C/3] and
    tiny (≤ C/6). (1) every large item opens a bin, largest first; (2) forward over those bins, add the largest
    medium item that fits; (3) backward over bins still without a medium item, add the smallest small item plus
    the largest small item that fits with it, when two small items fit; (4) forward over all bins, keep adding
    the largest remaining item that fits while the smallest remaining item fits; (5) pack the rest with FFD.

    Returns:
        Same contract as :func:`first_fit_decreasing`.
    """
    check_lengths_fit(lengths, capacity)
    indices = range(len(lengths))
    large = sorted((i for i in indices if 2 * lengths[i] > capacity), key=lambda i: (-lengths[i], i))
    medium = _SortedItems([i for i in indices if 3 * lengths[i] > capacity >= 2 * lengths[i]], lengths)
    small = _SortedItems([i for i in indices if 6 * lengths[i] > capacity >= 3 * lengths[i]], lengths)
    tiny = [i for i in indices if capacity >= 6 * lengths[i]]

    bins: Bins = [[i] for i in large]
    free = [capacity - lengths[i] for i in large]

    has_medium = [False] * len(bins)
    for b in range(len(bins)):
        if not medium:
            break
        if medium.smallest_length() <= free[b]:
            length, index = medium.pop_largest_fitting(free[b])  # type: ignore[misc]  # smallest fits
            bins[b].append(index)
            free[b] -= length
            has_medium[b] = True

    for b in reversed(range(len(bins))):
        if has_medium[b]:
            continue
        pair_length = small.smallest_pair_length()
        if pair_length is None or pair_length > free[b]:
            continue
        length, index = small.pop_smallest()
        partner_length, partner = small.pop_largest_fitting(free[b] - length)  # type: ignore[misc]
        bins[b] += [index, partner]
        free[b] -= length + partner_length

    rest = _SortedItems(medium.indices() + small.indices() + tiny, lengths)
    for b in range(len(bins)):
        while rest and rest.smallest_length() <= free[b]:
            length, index = rest.pop_largest_fitting(free[b])  # type: ignore[misc]
            bins[b].append(index)
            free[b] -= length

    leftover = sorted(rest.indices(), key=lambda i: (-lengths[i], i))
    return bins + first_fit(leftover, lengths, capacity)


PACKING_ALGORITHMS: dict[str, Callable[[Sequence[int], int], Bins]] = {
    "first_fit_decreasing": first_fit_decreasing,
    "modified_first_fit_decreasing": modified_first_fit_decreasing,
}


def pack_sequences(lengths: Sequence[int], capacity: int, algorithm: str) -> Bins:
    """Pack samples of the given token ``lengths`` into bins of at most ``capacity`` tokens.

    ``algorithm`` is a key of :data:`PACKING_ALGORITHMS`.
    """
    if algorithm not in PACKING_ALGORITHMS:
        raise ValueError(f"unknown sequence packing algorithm {algorithm!r}; choose one of {list(PACKING_ALGORITHMS)}")
    return PACKING_ALGORITHMS[algorithm](lengths, capacity)


def cut_padded_microbatches(lengths: Sequence[int], max_tokens: int) -> Bins:
    """Cut samples, in the given order, into consecutive microbatches whose padded size fits ``max_tokens``.

    A microbatch of ``n`` samples is padded to its longest sample, so it costs ``n * max(lengths)`` tokens. Feeding
    samples sorted by length keeps that padding small.

    Returns:
        Consecutive runs of positions ``[[0, 1, 2], [3, 4], ...]`` covering ``range(len(lengths))``.
    """
    check_lengths_fit(lengths, max_tokens)
    groups: Bins = []
    current: list[int] = []
    current_max = 0
    for position, length in enumerate(lengths):
        new_max = max(current_max, length)
        if current and new_max * (len(current) + 1) > max_tokens:
            groups.append(current)
            current, new_max = [], length
        current.append(position)
        current_max = new_max
    if current:
        groups.append(current)
    return groups


def split_groups_to_count(groups: Bins, count: int) -> Bins:
    """Return ``count`` groups by halving the group with the most samples until there are enough.

    Halving keeps each half's token cost within the original's bound (a subset of a bin still fits; a sorted run's
    halves are still sorted runs), so token limits hold. When every group holds one sample and more are needed,
    empty groups are appended; with equal sample counts per shard that never happens.
    """
    if len(groups) > count:
        raise ValueError(f"cannot reduce {len(groups)} groups to {count}; only splitting is supported")
    result = [list(group) for group in groups]
    while len(result) < count:
        largest = max(range(len(result)), key=lambda k: len(result[k]), default=None)
        if largest is None or len(result[largest]) <= 1:
            break
        group = result[largest]
        half = (len(group) + 1) // 2
        result[largest : largest + 1] = [group[:half], group[half:]]
    result.extend([] for _ in range(count - len(result)))
    return result


@dataclass(frozen=True)
class ShardMicrobatches:
    """Token-bounded microbatches of one data-parallel shard.

    Attributes:
        order: input indices in the shard's row order (microbatches are consecutive rows).
        ranges: ``ranges[g][m] = (start, end)``, rows of microbatch ``m`` of global batch ``g``.
        tokens: ``tokens[g][m]``; padded microbatches: the longest cost in it; bins: the sum of costs; 0 if empty.
    """

    order: list[int]
    ranges: list[list[tuple[int, int]]]
    tokens: list[list[int]]


def plan_packed_groups(
    lengths: Sequence[int],
    shards: int,
    batch_size: int,
    max_tokens: int,
    sequence_length_round: int,
    algorithm: str,
    rows_per_group: int,
) -> list[ShardMicrobatches]:
    """`plan_token_bounded_shards` with bin packing, for rows that come in adjacent groups of ``rows_per_group``
    that must stay together and in order (a DPO or reward-model pair: chosen, then rejected).

    Each group is packed as one item costing the sum of its rows' rounded costs; the plan's rows are the groups'
    rows in order, so every microbatch holds whole groups starting at a group boundary.
    """
    if len(lengths) % rows_per_group or batch_size % rows_per_group:
        raise ValueError(
            f"rows come in groups of {rows_per_group}, but the batch ({len(lengths)} rows) or the global batch "
            f"({batch_size}) is not a whole number of groups"
        )
    costs = [round_up(max(length, 1), sequence_length_round) for length in lengths]
    group_costs = [sum(costs[start : start + rows_per_group]) for start in range(0, len(costs), rows_per_group)]
    for group, cost in enumerate(group_costs):
        if cost > max_tokens:
            first = group * rows_per_group
            raise ValueError(
                f"rows {first}..{first + rows_per_group - 1} (one group of {rows_per_group} that must share a "
                f"microbatch) need {cost} tokens together, more than max_tokens_per_microbatch={max_tokens}; raise "
                "the limit or drop/truncate the sample"
            )
    plans = plan_token_bounded_shards(group_costs, shards, batch_size // rows_per_group, max_tokens, 1, algorithm)
    return [
        ShardMicrobatches(
            order=[group * rows_per_group + row for group in plan.order for row in range(rows_per_group)],
            ranges=[
                [(start * rows_per_group, end * rows_per_group) for start, end in ranges] for ranges in plan.ranges
            ],
            tokens=plan.tokens,
        )
        for plan in plans
    ]


def plan_token_bounded_shards(
    lengths: Sequence[int],
    shards: int,
    batch_size: int,
    max_tokens: int,
    sequence_length_round: int,
    algorithm: str | None,
) -> list[ShardMicrobatches]:
    """Deal each global batch of ``batch_size`` samples over ``shards`` and group each piece into microbatches.

    Each sample costs ``round_up(max(length, 1), sequence_length_round)`` tokens. A global batch is sorted by
    length and dealt round-robin, so every shard gets a similar mix of lengths (the first ``batch_size % shards``
    shards get one extra sample). Each piece is then cut into length-sorted padded microbatches
    (``algorithm=None``) or bin-packed with ``algorithm``, both bounded by ``max_tokens``. Shards with fewer
    microbatches than the most in that global batch are split up to that count (see
    :func:`split_groups_to_count`), because every rank must run the same number of forward/backward passes.
    """
    costs = [round_up(max(length, 1), sequence_length_round) for length in lengths]
    for index, cost in enumerate(costs):
        if cost > max_tokens:
            raise ValueError(
                f"sample {index} has length {lengths[index]} ({cost} tokens after rounding to "
                f"sequence_length_round={sequence_length_round}), more than max_tokens_per_microbatch={max_tokens}; "
                f"raise the limit or drop/truncate the sample"
            )
    plans = [ShardMicrobatches([], [], []) for _ in range(shards)]
    for start in range(0, len(lengths), batch_size):
        by_length = sorted(range(start, start + batch_size), key=lambda i: (lengths[i], i))
        groups_per_shard = []
        for members in (by_length[s::shards] for s in range(shards)):
            member_costs = [costs[i] for i in members]
            if algorithm is None:
                local = cut_padded_microbatches(member_costs, max_tokens)
            else:
                local = pack_sequences(member_costs, max_tokens, algorithm)
            groups_per_shard.append([[members[p] for p in group] for group in local])
        count = max(len(groups) for groups in groups_per_shard)
        for plan, groups in zip(plans, groups_per_shard, strict=True):
            ranges, tokens = [], []
            for group in split_groups_to_count(groups, count):
                ranges.append((len(plan.order), len(plan.order) + len(group)))
                plan.order.extend(group)
                group_costs = [costs[i] for i in group]
                tokens.append(max(group_costs, default=0) if algorithm is None else sum(group_costs))
            plan.ranges.append(ranges)
            plan.tokens.append(tokens)
    return plans
