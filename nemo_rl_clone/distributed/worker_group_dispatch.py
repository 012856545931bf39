"""Which worker of a `RayWorkerGroup` gets which piece of data, and collecting the results.

Kept apart from the group itself: planning is pure (no Ray) and is tested on its own; `MultiWorkerFuture` only needs
object refs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import ray

from nemo_rl_clone.distributed.named_sharding import NamedSharding
from nemo_rl_clone.utils import watchdog

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardedCallPlan:
    """``worker_index``: rank → index of its piece in data nested by ``in_sharded_axes`` (``None`` for dummy calls),
    only for the ranks to call, in rank order; ``return_ranks``: ranks whose results are returned, in rank order."""

    worker_index: dict[int, tuple[int, ...] | None]
    return_ranks: list[int]


@dataclass(frozen=True)
class ShardedDispatchPlan:
    """``worker_data``: rank → its data piece (None for dummy calls), only for the ranks to call, in rank order;
    ``return_ranks``: ranks whose results are returned, in rank order."""

    worker_data: dict[int, Any]
    return_ranks: list[int]


def plan_sharded_call(
    sharding: NamedSharding,
    in_sharded_axes: Sequence[str],
    replicate_on_axes: Sequence[str],
    output_is_replicated: Sequence[str],
    make_dummy_calls_to_free_axes: bool = False,
) -> ShardedCallPlan:
    """Which ranks to call, with which piece index, and whose results to return (see `plan_sharded_dispatch`)."""
    names = sharding.names
    for argument, axes in (
        ("in_sharded_axes", in_sharded_axes),
        ("replicate_on_axes", replicate_on_axes),
        ("output_is_replicated", output_is_replicated),
    ):
        unknown = [axis for axis in axes if axis not in names]
        if unknown:
            raise ValueError(f"{argument} names unknown axes {unknown}; the worker group's axes are {names}")
    both = sorted(set(in_sharded_axes) & set(replicate_on_axes))
    if both:
        raise ValueError(f"axes {both} are in both in_sharded_axes and replicate_on_axes; an axis is one or the other")

    free_axes = [axis for axis in names if axis not in in_sharded_axes and axis not in replicate_on_axes]
    worker_index: dict[int, tuple[int, ...] | None] = {}
    return_ranks: list[int] = []
    for rank in range(sharding.size):
        coords = sharding.get_worker_coords(rank)
        if all(coords[axis] == 0 for axis in free_axes):
            worker_index[rank] = tuple(coords[axis] for axis in in_sharded_axes)
            if all(coords[axis] == 0 for axis in output_is_replicated):
                return_ranks.append(rank)
        elif make_dummy_calls_to_free_axes:
            worker_index[rank] = None
    return ShardedCallPlan(worker_index=worker_index, return_ranks=return_ranks)


def plan_sharded_dispatch(
    sharding: NamedSharding,
    data: Any,
    in_sharded_axes: Sequence[str],
    replicate_on_axes: Sequence[str],
    output_is_replicated: Sequence[str],
    make_dummy_calls_to_free_axes: bool = False,
) -> ShardedDispatchPlan:
    """Decide which rank gets which piece of ``data``.

    ``data`` is nested, one level per entry of ``in_sharded_axes`` (in that order): ``data[i][j]`` goes to every rank
    whose coordinate on ``in_sharded_axes[0]`` is ``i`` and on ``in_sharded_axes[1]`` is ``j``, whatever its coordinates
    on ``replicate_on_axes``. Axes in neither list are *free*: only ranks at coordinate 0 on them are called (the
    others get ``None`` if ``make_dummy_calls_to_free_axes``, for methods containing collectives). Results are
    returned from ranks at coordinate 0 on every free axis and every axis in ``output_is_replicated``.
    """
    plan = plan_sharded_call(
        sharding, in_sharded_axes, replicate_on_axes, output_is_replicated, make_dummy_calls_to_free_axes
    )
    check_nesting(data, sharding, in_sharded_axes, "data")
    worker_data = {rank: None if index is None else piece_at(data, index) for rank, index in plan.worker_index.items()}
    return ShardedDispatchPlan(worker_data=worker_data, return_ranks=plan.return_ranks)


def check_nesting(data: Any, sharding: NamedSharding, in_sharded_axes: Sequence[str], where: str) -> None:
    """Raise ValueError unless ``data`` is nested lists with one level per sharded axis, each as long as its axis."""
    _check_level(data, [(axis, sharding.get_axis_size(axis)) for axis in in_sharded_axes], where)


def piece_at(data: Any, index: tuple[int, ...]) -> Any:
    for i in index:
        data = data[i]
    return data


def _check_level(data: Any, levels: list[tuple[str, int]], where: str) -> None:
    if not levels:
        return
    axis, size = levels[0]
    if not isinstance(data, (list, tuple)):
        raise ValueError(
            f"{where} must be a list of {size} pieces for axis {axis!r} (data is nested by in_sharded_axes), "
            f"got {type(data).__name__}"
        )
    if len(data) != size:
        raise ValueError(f"{where} has {len(data)} pieces but axis {axis!r} has size {size}")
    for i, piece in enumerate(data):
        _check_level(piece, levels[1:], f"{where}[{i}]")


class NamedWorkerGroup(Protocol):
    """What `MultiWorkerFuture.get_results` reads of a `RayWorkerGroup` (not imported: the group imports this module)."""

    name: str


class MultiWorkerFuture:
    """Pending results of one call on several workers.

    Args:
        futures: one ObjectRef (or ``ObjectRefGenerator``) per called worker.
        return_from_workers: ranks whose results `get_results` returns (default: all called workers).
        called_workers: the rank of each future (default ``0 .. len(futures) - 1``).
        group_name, method_name: for error messages.
    """

    futures: list[Any]
    return_from_workers: list[int]
    called_workers: list[int]

    def __init__(
        self,
        futures: list[Any],
        return_from_workers: list[int] | None = None,
        called_workers: list[int] | None = None,
        group_name: str = "",
        method_name: str = "",
    ) -> None:
        self.futures = list(futures)
        self.called_workers = list(called_workers) if called_workers is not None else list(range(len(self.futures)))
        if len(self.called_workers) != len(self.futures):
            raise ValueError(f"got {len(self.futures)} futures but {len(self.called_workers)} called workers")
        self.return_from_workers = (
            sorted(return_from_workers) if return_from_workers is not None else sorted(self.called_workers)
        )
        missing = sorted(set(self.return_from_workers) - set(self.called_workers))
        if missing:
            raise ValueError(f"return_from_workers {missing} were not called (called workers: {self.called_workers})")
        self.group_name = group_name
        self.method_name = method_name

    def get_results(
        self, worker_group: NamedWorkerGroup | None = None, return_generators_as_proxies: bool = False
    ) -> list[Any]:
        """Block until every called worker is done; results of ``return_from_workers`` in rank order.

        A failure of any worker is raised as soon as it happens (not after the workers before it in rank order,
        which may be blocked in a collective waiting for the failed one), with a note naming its rank.
        ``worker_group``, if given, must be the group that made this future (checked when it has a ``group_name``).

        Generator methods (``num_returns="streaming"``): with ``return_generators_as_proxies`` the futures of
        ``return_from_workers`` are returned unconsumed; otherwise every generator is drained and all the yielded
        values of all called workers come back flat, in rank order.
        """
        if worker_group is not None and self.group_name and worker_group.name != self.group_name:
            raise ValueError(f"this future comes from worker group {self.group_name!r}, not {worker_group.name!r}")
        position = {rank: i for i, rank in enumerate(self.called_workers)}
        if return_generators_as_proxies:
            return [self.futures[position[rank]] for rank in self.return_from_workers]
        if any(isinstance(future, ray.ObjectRefGenerator) for future in self.futures):
            refs, ranks = [], []
            for rank, future in zip(self.called_workers, self.futures, strict=True):
                items = list(future) if isinstance(future, ray.ObjectRefGenerator) else [future]
                refs += items
                ranks += [rank] * len(items)
            return get_fail_fast(refs, ranks, self._label())
        results = get_fail_fast(self.futures, self.called_workers, self._label())
        return [results[position[rank]] for rank in self.return_from_workers]

    def _label(self) -> str:
        return f"{self.group_name}.{self.method_name}"


def get_fail_fast(
    refs: list[ray.ObjectRef], ranks: list[int], label: str, log_pending_every_s: float | None = None
) -> list[Any]:
    """``ray.get`` of every ref, raising the first failure as soon as it happens (noted with the worker's rank).

    With ``log_pending_every_s``, logs the ranks still pending each time that long passes without progress.
    """
    position = {ref: i for i, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=log_pending_every_s)
        if not ready:
            waiting = sorted(ranks[position[ref]] for ref in pending)
            logger.warning("%s: workers %s still pending; available: %s", label, waiting, ray.available_resources())
        for ref in ready:
            try:
                results[position[ref]] = ray.get(ref)
            except ray.exceptions.RayError as error:
                error.add_note(f"raised by worker rank {ranks[position[ref]]} in {label}")
                raise
    return results


def actor_pid(actor: Any) -> int:
    """The pid of the actor it runs in (called with ``__ray_call__``)."""
    return os.getpid()


class WatchedMethod:
    """An actor method whose calls the watchdog sees (`utils.watchdog.track`) while one runs."""

    def __init__(self, bound: Any, label: str, pid: int | None) -> None:
        self.bound, self.label, self.pid = bound, label, pid

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        ref = self.bound.remote(*args, **kwargs)
        for one in ref if isinstance(ref, list) else [ref]:
            watchdog.track(one, self.label, self.pid)
        return ref
