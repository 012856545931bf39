"""What the data plane's callers see: `KVBatchMeta` (a handle naming rows in the queue) and `DataPlaneClient`.

A run with ``data_plane.enabled`` keeps its trainer's bulk tensors in a queue outside the driver: the driver writes
a step's rows once and from then on hands the policy workers keys, and the per-token results the workers compute
(logprobs) go back into the queue under the same keys instead of through the driver (docs/data_plane.md).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class KVBatchMeta:
    """Rows in the queue: their keys in order, the fields written for them, each row's token count, and what a
    reader needs besides the rows (``extra_info``: e.g. a microbatch plan). Small: this is what moves between
    processes in place of the rows."""

    partition_id: str
    task_name: str | None = None
    sample_ids: list[str] = field(default_factory=list)
    fields: list[str] = field(default_factory=list)
    sequence_lengths: list[int] = field(default_factory=list)
    extra_info: dict[str, Any] = field(default_factory=dict)
    tags: list[dict[str, Any]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.sample_ids)

    def subset(self, indices: Sequence[int]) -> KVBatchMeta:
        """The rows at ``indices``, in that order."""
        return dataclasses.replace(
            self,
            sample_ids=[self.sample_ids[i] for i in indices],
            sequence_lengths=[self.sequence_lengths[i] for i in indices] if self.sequence_lengths else [],
            tags=[self.tags[i] for i in indices] if self.tags else [],
            extra_info=dict(self.extra_info),
        )

    def slice(self, start: int, stop: int) -> KVBatchMeta:
        return self.subset(range(start, stop))

    def stamp_tags(self, scalars: Mapping[str, Any]) -> None:
        """Add ``scalars`` to every row's tag."""
        self.tags = [{**tag, **scalars} for tag in (self.tags or [{} for _ in self.sample_ids])]

    @staticmethod
    def concat(*others: KVBatchMeta) -> KVBatchMeta:
        """One handle for the rows of ``others`` (all of one partition), in order."""
        partitions = {meta.partition_id for meta in others}
        if len(partitions) != 1:
            raise ValueError(f"KVBatchMeta.concat: rows of one partition only, got {sorted(partitions)}")
        first = others[0]
        return dataclasses.replace(
            first,
            sample_ids=[key for meta in others for key in meta.sample_ids],
            sequence_lengths=[n for meta in others for n in meta.sequence_lengths],
            tags=[tag for meta in others for tag in meta.tags],
            extra_info=dict(first.extra_info),
        )


class DataPlaneClient(abc.ABC):
    """A process's connection to the queue: rows are written, read and dropped by key within a partition."""

    def wait_until_started(self) -> None:  # noqa: B027  (optional: an engine that starts without waiting)
        """Return once the queue serves (a driver's client may start it without waiting)."""

    @abc.abstractmethod
    def put_samples(
        self,
        sample_ids: Sequence[str],
        partition_id: str,
        fields: Mapping[str, torch.Tensor] | None = None,
        tags: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Write (or add) ``fields`` — tensors ``[len(sample_ids), ...]`` — for the rows ``sample_ids``."""

    @abc.abstractmethod
    def get_samples(
        self, sample_ids: Sequence[str], partition_id: str, select_fields: Sequence[str]
    ) -> dict[str, torch.Tensor]:
        """``select_fields`` of the rows ``sample_ids``, each a tensor ``[len(sample_ids), ...]`` in that order."""

    @abc.abstractmethod
    def clear_samples(self, sample_ids: Sequence[str], partition_id: str) -> None:
        """Drop the rows ``sample_ids``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Disconnect; the process that started the queue also stops it."""
