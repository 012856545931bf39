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
        layout: nested list / array of ints, shape ``(size_0, ..., size_{ndim-1})``, holding every rank
            ``0 .. N-1`` exactly once (``N`` = number of elements).
        names: one unique, non-empty axis name per layout dimension, outermost first.

    Raises:
        ValueError: names count differs from ``layout.ndim``, names repeat, or the ranks are not a permutation of
            ``0 .. N-1``.
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
        if not np.array_equal(np.sort(flat), np.arange(flat.size)):
            missing = sorted(set(range(flat.size)) - set(flat.tolist()))
            values, counts = np.unique(flat, return_counts=True)
            duplicated = values[counts > 1].tolist()
            raise ValueError(
                f"NamedSharding layout must contain every rank 0..{flat.size - 1} exactly once; "
                f"missing {missing}, duplicated {duplicated}, got {array.tolist()}"
            )

        self._layout = array.astype(np.int64)
        self._layout.setflags(write=False)
        self._names = names
        # rank -> coordinate tuple; argsort of the flat layout gives each rank's flat position.
        positions = np.unravel_index(np.argsort(flat), array.shape)
        self._coords_by_rank = [tuple(int(axis[r]) for axis in positions) for r in range(flat.size)]

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

    def get_axis_size(self, name: str) -> int:
        return int(self._layout.shape[self._axis_index(name)])

    def get_worker_coords(self, rank: int) -> dict[str, int]:
        """Coordinates of global ``rank``: axis name → index along that axis."""
        rank = operator.index(rank)
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} is outside this NamedSharding's ranks 0..{self.size - 1}")
        return dict(zip(self._names, self._coords_by_rank[rank], strict=True))

    def get_ranks(self, **coords: int) -> int | np.ndarray:
        """Ranks at the given (possibly partial) coordinates.

        Returns:
            An ``int`` when every axis is given. Otherwise an int64 ``np.ndarray`` of global ranks whose
            dimensions are the axes *not* given, in ``names`` order; e.g. on a ``(dp=2, tp=2)`` layout
            ``get_ranks(data_parallel=1)`` is ``array([2, 3])`` (the tensor-parallel group of DP rank 1).
        """
        index: list[int | slice] = [slice(None)] * self.ndim
        for name, value in coords.items():
            axis = self._axis_index(name)
            value = operator.index(value)
            size = self._layout.shape[axis]
            if not 0 <= value < size:
                raise ValueError(f"coordinate {name}={value} is out of range: axis {name!r} has size {size}")
            index[axis] = value
        selected = self._layout[tuple(index)]
        if len(coords) == self.ndim:
            return int(selected)
        return np.array(selected)

    def get_axis_groups(self, name: str) -> list[list[int]]:
        """Partition all ranks into groups that differ only along axis ``name``.

        Each group is ordered by its coordinate on ``name``; groups are ordered by the other coordinates. On a
        ``(dp=2, tp=2)`` layout, ``get_axis_groups("data_parallel")`` is ``[[0, 2], [1, 3]]``: the ranks that
        all-reduce gradients together. Used to build one process group per slice.
        """
        axis = self._axis_index(name)
        moved = np.moveaxis(self._layout, axis, -1)
        return moved.reshape(-1, moved.shape[-1]).tolist()

    def _axis_index(self, name: str) -> int:
        try:
            return self._names.index(name)
        except ValueError:
            raise ValueError(f"unknown axis {name!r}; this NamedSharding has axes {self._names}") from None

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
