"""NeMo-RL's sequence packers: sequence lengths → bins (lists of indices) of at most ``bin_capacity`` tokens each.

The bin-packing algorithms are the ones training uses (`nemo_rl_clone.distributed.sequence_packing`); these classes
add NeMo-RL's interface around them: a minimum / multiple bin count, and optional `PackingMetrics`.
"""

from __future__ import annotations

import enum
import random
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from nemo_rl_clone.data.packing.metrics import PackingMetrics
from nemo_rl_clone.distributed.sequence_packing import first_fit, modified_first_fit_decreasing

Bins = list[list[int]]


class PackingAlgorithm(enum.Enum):
    """The packers `get_packer` builds (a string names one case-insensitively by its enum name)."""

    CONCATENATIVE = "concatenative"
    FIRST_FIT_DECREASING = "first_fit_decreasing"
    FIRST_FIT_SHUFFLE = "first_fit_shuffle"
    MODIFIED_FIRST_FIT_DECREASING = "modified_first_fit_decreasing"


class SequencePacker(ABC):
    """Packs sequence lengths into bins of at most ``bin_capacity``; subclasses choose the algorithm.

    ``min_bin_count`` / ``bin_count_multiple``: the result has at least that many bins / a multiple of that many
    (e.g. one bin per data-parallel rank); extra bins are made by moving single sequences out of the fullest-counted
    bins, and a ``ValueError`` is raised when there are fewer sequences than bins asked for.
    """

    def __init__(
        self,
        bin_capacity: int,
        collect_metrics: bool = False,
        min_bin_count: int | None = None,
        bin_count_multiple: int | None = None,
    ) -> None:
        if min_bin_count is not None and min_bin_count < 0:
            raise ValueError("min_bin_count must be nonnegative")
        if bin_count_multiple is not None and bin_count_multiple < 1:
            raise ValueError("bin_count_multiple must be positive")
        self.bin_capacity = bin_capacity
        self.collect_metrics = collect_metrics
        self.min_bin_count = min_bin_count
        self.bin_count_multiple = bin_count_multiple
        self.metrics = PackingMetrics() if collect_metrics else None

    @abstractmethod
    def _pack_implementation(self, sequence_lengths: list[int]) -> Bins:
        """The algorithm: bins of indices into ``sequence_lengths``, each index once."""

    def pack(self, sequence_lengths: list[int]) -> Bins:
        """Bins of indices into ``sequence_lengths`` meeting the bin-count constraints; metrics updated if kept."""
        bins = self._adjust_bin_count(self._pack_implementation(list(sequence_lengths)))
        if self.metrics is not None:
            self.metrics.update(sequence_lengths, bins, self.bin_capacity)
        return bins

    def _target_bin_count(self, count: int) -> int:
        target = max(count, self.min_bin_count or 0)
        if self.bin_count_multiple is not None:
            target = -(-target // self.bin_count_multiple) * self.bin_count_multiple
        return target

    def _adjust_bin_count(self, bins: Bins) -> Bins:
        """Add bins up to the target count, each taking the last sequence of the bin with the most sequences (ties:
        the later bin) that still has two or more; the packing is otherwise left as it is."""
        target = self._target_bin_count(len(bins))
        if target == len(bins):
            return bins
        total = sum(len(members) for members in bins)
        if total < target:
            raise ValueError(
                f"Cannot create {target} bins with only {total} sequences. Each bin must contain at least one "
                "sequence. Either reduce min_bin_count/bin_count_multiple or provide more sequences."
            )
        adjusted = [list(members) for members in bins]
        donors = [index for _, index in sorted(((len(members), i) for i, members in enumerate(bins)), reverse=True)]
        donor = 0
        for _ in range(target - len(bins)):
            while len(adjusted[donors[donor]]) < 2:  # total >= target guarantees a donor remains
                donor += 1
            adjusted.append([adjusted[donors[donor]].pop()])
        return adjusted

    def _validate_sequence_lengths(self, sequence_lengths: list[int]) -> None:
        for length in sequence_lengths:
            if length > self.bin_capacity:
                raise ValueError(f"Sequence length {length} exceeds bin capacity {self.bin_capacity}")

    def reset_metrics(self) -> None:
        """Forget the collected metrics (nothing to do without ``collect_metrics``)."""
        if self.metrics is not None:
            self.metrics.reset()

    def compute_metrics(self, sequence_lengths: list[int], bins: Bins) -> dict[str, Any]:
        """`PackingMetrics.calculate_stats_only` of a packing, without adding it to the collected metrics."""
        return (self.metrics or PackingMetrics()).calculate_stats_only(sequence_lengths, bins, self.bin_capacity)

    def get_aggregated_metrics(self) -> dict[str, Any]:
        """The collected metrics over every `pack` (``{}`` without ``collect_metrics``)."""
        return self.metrics.get_aggregated_stats() if self.metrics is not None else {}

    def print_metrics(self) -> None:
        """Print the collected metrics."""
        if self.metrics is None:
            print("Metrics collection is not enabled. Initialize with collect_metrics=True.")
            return
        self.metrics.print_aggregated_stats()


class ConcatenativePacker(SequencePacker):
    """Sequences in their order, a new bin whenever the next one does not fit (or the bin holds
    ``max_sequences_per_bin`` sequences; -1: no limit). Lengths [4, 1, 3, 2, 1, 3, 4, 5] in bins of 5 →
    [[0, 1], [2, 3], [4, 5], [6], [7]]."""

    max_sequences_per_bin: ClassVar[int] = -1

    def _pack_implementation(self, sequence_lengths: list[int]) -> Bins:
        self._validate_sequence_lengths(sequence_lengths)
        bins: Bins = []
        filled = 0
        for index, length in enumerate(sequence_lengths):
            limit = self.max_sequences_per_bin
            full = bool(bins) and limit != -1 and len(bins[-1]) >= limit
            if not bins or full or filled + length > self.bin_capacity:
                bins.append([])
                filled = 0
            bins[-1].append(index)
            filled += length
        return bins


class FirstFitPacker(SequencePacker):
    """Each sequence, in the order `_prepare_sequences` gives, into the first bin with room (a new bin if none)."""

    def _prepare_sequences(self, sequence_lengths: list[int]) -> list[tuple[int, int]]:
        """``(length, index)`` pairs in packing order."""
        raise NotImplementedError("Subclasses must implement _prepare_sequences")

    def _pack_implementation(self, sequence_lengths: list[int]) -> Bins:
        order = [index for _, index in self._prepare_sequences(sequence_lengths)]
        self._validate_sequence_lengths(sequence_lengths)
        return first_fit(order, sequence_lengths, self.bin_capacity)


class FirstFitDecreasingPacker(FirstFitPacker):
    """First-fit, longest sequence first (equal lengths: the later index first)."""

    def _prepare_sequences(self, sequence_lengths: list[int]) -> list[tuple[int, int]]:
        return sorted(((length, index) for index, length in enumerate(sequence_lengths)), reverse=True)


class FirstFitShufflePacker(FirstFitPacker):
    """First-fit in a random order, drawn from Python's ``random`` (``random.seed`` makes it repeatable)."""

    def _prepare_sequences(self, sequence_lengths: list[int]) -> list[tuple[int, int]]:
        pairs = [(length, index) for index, length in enumerate(sequence_lengths)]
        random.shuffle(pairs)
        return pairs


class ModifiedFirstFitDecreasingPacker(SequencePacker):
    """Johnson & Garey's Modified First-Fit Decreasing (`modified_first_fit_decreasing`, the algorithm training
    packs with); sequence lengths must be positive."""

    def _pack_implementation(self, sequence_lengths: list[int]) -> Bins:
        if self.bin_capacity <= 0:
            raise ValueError("bin_capacity must be positive")
        if any(length <= 0 for length in sequence_lengths):
            raise ValueError("sequence lengths must be positive")
        self._validate_sequence_lengths(sequence_lengths)
        return modified_first_fit_decreasing(sequence_lengths, self.bin_capacity)


_PACKERS: dict[PackingAlgorithm, type[SequencePacker]] = {
    PackingAlgorithm.CONCATENATIVE: ConcatenativePacker,
    PackingAlgorithm.FIRST_FIT_DECREASING: FirstFitDecreasingPacker,
    PackingAlgorithm.FIRST_FIT_SHUFFLE: FirstFitShufflePacker,
    PackingAlgorithm.MODIFIED_FIRST_FIT_DECREASING: ModifiedFirstFitDecreasingPacker,
}


def get_packer(
    algorithm: PackingAlgorithm | str,
    bin_capacity: int,
    collect_metrics: bool = False,
    min_bin_count: int | None = None,
    bin_count_multiple: int | None = None,
) -> SequencePacker:
    """The packer of ``algorithm`` (a `PackingAlgorithm`, or its name in any case: ``"first_fit_decreasing"``)."""
    choice = PackingAlgorithm.__members__.get(algorithm.upper()) if isinstance(algorithm, str) else algorithm
    if choice not in _PACKERS:
        names = ", ".join(PackingAlgorithm.__members__)
        raise ValueError(f"Unknown packing algorithm: {algorithm}. Available algorithms: {names}")
    return _PACKERS[choice](
        bin_capacity,
        collect_metrics=collect_metrics,
        min_bin_count=min_bin_count,
        bin_count_multiple=bin_count_multiple,
    )
