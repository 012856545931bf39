"""Wall-clock timing of named sections of a training step.

Labels are flat: a section timed inside another keeps its own label (no "outer/inner" joining), matching
NeMo-RL's metric names. A GRPO step looks like::

    timer = Timer()
    with timer.time("total_step_time"):
        with timer.time("generation"):
            ...
        with timer.time("policy_training"):
            ...
    logger.log_metrics(timer.get_timing_metrics("sum"), step, prefix="timing/train")
    timer.reset()

The algorithm (not the timer) adds the ``timing/train/`` prefix, giving ``timing/train/generation``,
``timing/train/total_step_time``, ... . Durations are in seconds, measured with ``time.perf_counter``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

_REDUCTIONS: dict[str, Callable[[list[float]], float]] = {
    "sum": lambda xs: float(sum(xs)),
    "mean": lambda xs: float(sum(xs) / len(xs)),
    "max": lambda xs: float(max(xs)),
    "min": lambda xs: float(min(xs)),
    "count": lambda xs: float(len(xs)),
}
REDUCTION_OPS: tuple[str, ...] = tuple(_REDUCTIONS)


class Timer:
    """Records durations per label; repeated entries of a label accumulate until `reset`.

    Sections may nest (different labels), but a label cannot be started while it is already running.
    """

    def __init__(self) -> None:
        self._running: dict[str, float] = {}  # label -> perf_counter() at start
        self._durations: dict[str, list[float]] = {}  # label -> completed durations (s), in order

    @contextmanager
    def time(self, label: str) -> Iterator[None]:
        """Times the body under `label`. The duration is recorded even if the body raises."""
        self.start(label)
        try:
            yield
        finally:
            self.stop(label)

    def start(self, label: str) -> None:
        """Starts timing `label`; raises RuntimeError if it is already running."""
        if not isinstance(label, str) or not label:
            raise ValueError(f"Timer label must be a non-empty string, got {label!r}")
        if label in self._running:
            raise RuntimeError(
                f"Timer label {label!r} is already running; stop it before starting it again "
                "(nest sections under different labels)"
            )
        self._running[label] = time.perf_counter()

    def stop(self, label: str) -> float:
        """Stops timing `label`, records the duration and returns it in seconds."""
        started = self._running.pop(label, None)
        if started is None:
            running = sorted(self._running) or "none"
            raise RuntimeError(f"Timer label {label!r} is not running (running labels: {running})")
        elapsed = time.perf_counter() - started
        self._durations.setdefault(label, []).append(elapsed)
        return elapsed

    def get_durations(self, label: str) -> list[float]:
        """All completed durations of `label` since the last reset, in order (a copy)."""
        if label not in self._durations:
            raise KeyError(f"Timer label {label!r} has no recorded durations (known: {sorted(self._durations)})")
        return list(self._durations[label])

    def get_timing_metrics(self, reduction_op: str | Mapping[str, str] = "sum") -> dict[str, float]:
        """One float per label with at least one completed duration; running sections are not included.

        `reduction_op` is one of "sum", "mean", "max", "min", "count" (number of entries), or a mapping
        label -> op where labels missing from the mapping use "sum".
        """
        per_label = reduction_op if isinstance(reduction_op, Mapping) else {}
        default_op = "sum" if isinstance(reduction_op, Mapping) else reduction_op
        for where, op in [("reduction_op", default_op), *((f"reduction_op[{k!r}]", v) for k, v in per_label.items())]:
            if op not in _REDUCTIONS:
                raise ValueError(f"{where} must be one of {list(REDUCTION_OPS)}, got {op!r}")
        return {
            label: _REDUCTIONS[per_label.get(label, default_op)](durations)
            for label, durations in self._durations.items()
        }

    def reset(self, label: str | None = None) -> None:
        """Forgets recorded durations and abandons running sections, for every label or only `label`."""
        if label is None:
            self._durations.clear()
            self._running.clear()
            return
        if label not in self._durations and label not in self._running:
            raise KeyError(f"Timer label {label!r} is unknown (known: {sorted({*self._durations, *self._running})})")
        self._durations.pop(label, None)
        self._running.pop(label, None)
