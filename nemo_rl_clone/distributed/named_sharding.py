"""Named N-d layout of global ranks: maps ranks to named coordinates and back.

A worker group of ``dp * tp`` ranks is described as ``NamedSharding([[0, 1], [2, 3]], ["data_parallel",
"tensor_parallel"])``: rank 3 sits at ``{"data_parallel": 1, "tensor_parallel": 1}``. Worker groups use it to
decide which data shard each rank receives and which ranks form a collective group.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np


class NamedSharding:
    """An N-d array of global ranks with one name per axis.

    Args:
        layout: nested list / array of ints, shape ``(size_0, ..., size_{ndim-1})``, holding distinct
            non-negative global ranks. A worker group's layout holds every rank ``0 .. N-1``; a sub-layout from
            `get_ranks` holds the subset of global ranks it selected.
        names: one unique, non-empty axis name per layout dimension, outermost first.

    Raises:
        ValueError: names count differs from ``layout.ndim``, names repeat, or a rank is negative or repeated.
    """

    def __init__(self, layout: Any, names: Sequence[str]) -> None:
        array = np.asarray(layout)
        if array.ndim == 0 or array.size == 0:
            raise ValueError(f"NamedSharding layout must be a non-empty array with ndim >= 1, got shape {array.shape}")
        if not np.issubdtype(array.dtype, np.integer):
            raise ValueError(f"NamedSharding layout must hold integer ranks, got dtype {array.dtype}")
        names = list(names)
        if len(names) != array.ndim:
            raise ValueError(
                f"NamedSharding got {len(names)} axis names {names} for a layout with ndim={array.ndim} "
                f"(shape {array.shape}); give exactly one name per layout dimension"
            )
        for name in names:
            if not isinstance(name, str) or not name:
                raise ValueError(f"NamedSharding axis names must be non-empty strings, got {name!r} in {names}")
        if len(set(names)) != len(names):
            raise ValueError(f"NamedSharding axis names must be unique, got {names}")
        flat = array.reshape(-1)
        values, counts = np.unique(flat, return_counts=True)
        duplicated, negative = values[counts > 1].tolist(), values[values < 0].tolist()
        if duplicated or negative:
            raise ValueError(
                f"NamedSharding layout must hold distinct non-negative ranks; duplicated {duplicated}, "
                f"negative {negative}, got {array.tolist()}"
            )

        self._layout = array.astype(np.int64)
        self._layout.setflags(write=False)
        self._names = names
        self._coords_by_rank = {int(rank): tuple(int(i) for i in index) for index, rank in np.ndenumerate(self._layout)}

    @property
    def layout(self) -> np.ndarray:
        """Read-only int64 array of global ranks, one dimension per axis name."""
        return self._layout

    @property
    def names(self) -> list[str]:
        """Axis names, outermost first (a copy)."""
        return list(self._names)

    @property
    def ndim(self) -> int:
        return self._layout.ndim

    @property
    def shape(self) -> dict[str, int]:
        """Axis name → axis size, in axis order."""
        return dict(zip(self._names, self._layout.shape, strict=True))

    @property
    def size(self) -> int:
        """Total number of ranks."""
        return int(self._layout.size)

    def get_axis_index(self, name: str) -> int:
        """Position of axis ``name`` in `names` (ValueError for an unknown axis)."""
        try:
            return self._names.index(name)
        except ValueError:
            raise ValueError(f"unknown axis {name!r}; this NamedSharding has axes {self._names}") from None

    def get_axis_size(self, name: str) -> int:
        return int(self._layout.shape[self.get_axis_index(name)])

    def contains_worker_id(self, worker_id: int) -> bool:
        """Whether global rank ``worker_id`` is in this layout."""
        return operator.index(worker_id) in self._coords_by_rank

    def get_worker_coords(self, worker_id: int) -> dict[str, int]:
        """Coordinates of global rank ``worker_id``: axis name → index along that axis."""
        worker_id = operator.index(worker_id)
        if worker_id not in self._coords_by_rank:
            raise ValueError(f"rank {worker_id} is not in this NamedSharding (ranks {self._describe_ranks()})")
        return dict(zip(self._names, self._coords_by_rank[worker_id], strict=True))

    def get_ranks(self, **kwargs: int) -> NamedSharding | int:
        """The sub-layout at the given (possibly partial) coordinates.

        Returns:
            An ``int`` (the global rank) when every axis is given. Otherwise a `NamedSharding` over the axes *not*
            given, in `names` order, holding global ranks; e.g. on a ``(dp=2, tp=2)`` layout
            ``get_ranks(data_parallel=1).layout`` is ``[2, 3]`` (the tensor-parallel group of DP rank 1).

        Raises:
            ValueError: unknown axis name. IndexError: coordinate outside its axis.
        """
        selected = self._select_ranks(**kwargs)
        if isinstance(selected, int):
            return selected
        return NamedSharding(selected, [name for name in self._names if name not in kwargs])

    def _select_ranks(self, **coords: int) -> int | np.ndarray:
        """`get_ranks` with a partial selection as a plain int64 array of global ranks."""
        index: list[int | slice] = [slice(None)] * self.ndim
        for name, value in coords.items():
            axis = self.get_axis_index(name)
            value = operator.index(value)
            size = self._layout.shape[axis]
            if not 0 <= value < size:
                raise IndexError(f"coordinate {name}={value} is out of range: axis {name!r} has size {size}")
            index[axis] = value
        selected = self._layout[tuple(index)]
        if len(coords) == self.ndim:
            return int(selected)
        return np.array(selected)

    def get_ranks_by_coord(self, **coords: int) -> list[int]:
        """Sorted global ranks whose coordinates match every given ``axis=index``; axes not given match any index.

        A coordinate outside its axis matches nothing (``[]``); an unknown axis name raises ValueError.
        """
        for name in coords:
            self.get_axis_index(name)
        if any(not 0 <= operator.index(value) < self.get_axis_size(name) for name, value in coords.items()):
            return []
        selected = self._select_ranks(**coords)
        return [selected] if isinstance(selected, int) else sorted(selected.reshape(-1).tolist())

    @staticmethod
    def is_axis_zero(coords: dict[str, int], axes: Sequence[str]) -> bool:
        """Whether ``coords`` is 0 on every axis of ``axes`` (an axis missing from ``coords`` counts as 0)."""
        return all(coords.get(axis, 0) == 0 for axis in axes)

    def get_axis_groups(self, name: str) -> list[list[int]]:
        """Partition all ranks into groups that differ only along axis ``name``.

        Each group is ordered by its coordinate on ``name``; groups are ordered by the other coordinates. On a
        ``(dp=2, tp=2)`` layout, ``get_axis_groups("data_parallel")`` is ``[[0, 2], [1, 3]]``: the ranks that
        all-reduce gradients together. Used to build one process group per slice.
        """
        axis = self.get_axis_index(name)
        moved = np.moveaxis(self._layout, axis, -1)
        return moved.reshape(-1, moved.shape[-1]).tolist()

    def _describe_ranks(self) -> str:
        ranks = sorted(self._coords_by_rank)
        return f"0..{len(ranks) - 1}" if ranks == list(range(len(ranks))) else str(ranks)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # numpy unpickles arrays as writable; keep the layout immutable after a trip through Ray.
        self.__dict__.update(state)
        self._layout.setflags(write=False)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NamedSharding):
            return NotImplemented
        return self._names == other._names and np.array_equal(self._layout, other._layout)

    def __hash__(self) -> int:
        return hash((tuple(self._names), self._layout.shape, self._layout.tobytes()))

    def __repr__(self) -> str:
        return f"NamedSharding(names={self._names}, shape={self.shape}, layout={self._layout.tolist()})"
