"""How well a packing fills its bins, for one packing and summed over many (NeMo-RL's ``PackingMetrics``)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

_EMPTY_STATS: dict[str, Any] = {
    "num_sequences": 0,
    "num_bins": 0,
    "total_sequence_length": 0,
    "total_bin_capacity": 0,
    "total_waste": 0,
    "average_utilization": 0.0,
    "waste_ratio": 0.0,
    "bin_balance": 0.0,
    "theoretical_min_bins": 0,
    "bin_efficiency": 0.0,
}


class PackingMetrics:
    """Utilization, waste and balance of packings (bins are lists of indices into the sequence lengths).

    `calculate_stats_only` describes one packing; `update` does the same and adds it to the totals that
    `get_aggregated_stats` reports.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every packing seen so far."""
        self.total_sequences = 0
        self.total_bins = 0
        self.total_sequence_length = 0
        self.total_bin_capacity = 0
        self.total_waste = 0
        self.bin_utilizations: list[float] = []  # one average utilization per packing
        self.bin_counts: list[int] = []
        self.packing_times: list[float] = []
        self.min_utilization = 1.0
        self.max_utilization = 0.0
        self.min_waste_ratio = 1.0
        self.max_waste_ratio = 0.0

    def update(
        self,
        sequence_lengths: Sequence[int],
        bins: Sequence[Sequence[int]],
        bin_capacity: int,
        packing_time: float | None = None,
    ) -> dict[str, Any]:
        """`calculate_stats_only` of this packing, also added to the totals (and ``packing_time``, when given)."""
        stats = self.calculate_stats_only(sequence_lengths, bins, bin_capacity)
        self.total_sequences += len(sequence_lengths)
        self.total_bins += len(bins)
        self.total_sequence_length += sum(sequence_lengths)
        self.total_bin_capacity += len(bins) * bin_capacity
        self.total_waste += stats["total_waste"]
        self.bin_utilizations.append(stats["average_utilization"])
        self.bin_counts.append(len(bins))
        if packing_time is not None:
            self.packing_times.append(packing_time)
        self.min_utilization = min(self.min_utilization, stats["average_utilization"])
        self.max_utilization = max(self.max_utilization, stats["average_utilization"])
        self.min_waste_ratio = min(self.min_waste_ratio, stats["waste_ratio"])
        self.max_waste_ratio = max(self.max_waste_ratio, stats["waste_ratio"])
        return stats

    def calculate_stats_only(
        self, sequence_lengths: Sequence[int], bins: Sequence[Sequence[int]], bin_capacity: int
    ) -> dict[str, Any]:
        """One packing: sizes, ``total_waste`` (capacity left empty), ``average_utilization`` (tokens / capacity of
        the bins used), ``waste_ratio``, ``bin_balance`` (1 - stdev of the bins' fill / average fill; 1.0 for one
        bin), ``theoretical_min_bins`` (ceil(tokens / capacity)) and ``bin_efficiency`` (that / bins used)."""
        if not bins:
            return dict(_EMPTY_STATS)
        total_length = sum(sequence_lengths)
        total_capacity = len(bins) * bin_capacity
        utilization = total_length / total_capacity
        fills = [sum(sequence_lengths[index] for index in members) / bin_capacity for members in bins]
        balance = 1.0 - statistics.stdev(fills) / utilization if len(bins) > 1 else 1.0
        min_bins = math.ceil(total_length / bin_capacity)
        return {
            "num_sequences": len(sequence_lengths),
            "num_bins": len(bins),
            "total_sequence_length": total_length,
            "total_bin_capacity": total_capacity,
            "total_waste": total_capacity - total_length,
            "average_utilization": utilization,
            "waste_ratio": (total_capacity - total_length) / total_capacity,
            "bin_balance": balance,
            "theoretical_min_bins": min_bins,
            "bin_efficiency": min_bins / len(bins),
        }

    def get_aggregated_stats(self) -> dict[str, Any]:
        """Totals over every `update` since the last `reset` (``{}`` before the first)."""
        if not self.bin_utilizations:
            return {}
        capacity = self.total_bin_capacity
        min_bins = math.ceil(self.total_sequence_length / (capacity / self.total_bins)) if self.total_bins else 0
        stats: dict[str, Any] = {
            "total_sequences": self.total_sequences,
            "total_bins": self.total_bins,
            "average_utilization": self.total_sequence_length / capacity if capacity else 0.0,
            "min_utilization": self.min_utilization,
            "max_utilization": self.max_utilization,
            "average_waste_ratio": self.total_waste / capacity if capacity else 0.0,
            "min_waste_ratio": self.min_waste_ratio,
            "max_waste_ratio": self.max_waste_ratio,
            "average_bin_count": sum(self.bin_counts) / len(self.bin_counts),
            "bin_efficiency": min_bins / self.total_bins if self.total_bins else 0.0,
        }
        if self.packing_times:
            stats["average_packing_time"] = sum(self.packing_times) / len(self.packing_times)
        return stats

    def print_aggregated_stats(self) -> None:
        """Print `get_aggregated_stats` as a short summary."""
        stats = self.get_aggregated_stats()
        if not stats:
            print("No metrics collected yet.")
            return
        print("\n=== Packing Metrics Summary ===")
        print(f"Total sequences packed: {stats['total_sequences']}")
        print(f"Total bins used: {stats['total_bins']}")
        print(
            f"Average bin utilization: {stats['average_utilization']:.4f} "
            f"(min: {stats['min_utilization']:.4f}, max: {stats['max_utilization']:.4f})"
        )
        print(
            f"Average waste ratio: {stats['average_waste_ratio']:.4f} "
            f"(min: {stats['min_waste_ratio']:.4f}, max: {stats['max_waste_ratio']:.4f})"
        )
        print(f"Bin efficiency (theoretical min bins / actual bins): {stats['bin_efficiency']:.4f}")
        if "average_packing_time" in stats:
            print(f"Average packing time: {stats['average_packing_time']:.6f} seconds")
        print("===============================\n")
