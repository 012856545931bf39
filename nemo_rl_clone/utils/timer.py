"""Wall-clock timing of named sections of a training step (NeMo-RL's ``Timer``), and the ``DD:HH:MM:SS`` save
deadline check (NeMo-RL's ``TimeoutChecker``).

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

import logging
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import overload

from nemo_rl_clone.utils.checkpoint_schedule import parse_deadline

log = logging.getLogger(__name__)

_REDUCTIONS: dict[str, Callable[[list[float]], float]] = {
    "sum": lambda xs: float(sum(xs)),
    "mean": lambda xs: float(sum(xs) / len(xs)),
    "max": lambda xs: float(max(xs)),
    "min": lambda xs: float(min(xs)),
    "count": lambda xs: float(len(xs)),
    "median": lambda xs: float(statistics.median(xs)),
    "std": lambda xs: float(statistics.pstdev(xs)),  # population std, as numpy's default
}
REDUCTION_OPS: tuple[str, ...] = tuple(_REDUCTIONS)


class Timer:
    """Records durations per label; repeated entries of a label accumulate until `reset`.

    Sections may nest (different labels), but a label cannot be started while it is already running.
    ``should_log`` (NeMo-RL's argument) emits a DEBUG line per start/stop.
    """

    def __init__(self) -> None:
        self._running: dict[str, float] = {}  # label -> perf_counter() at start
        self._durations: dict[str, list[float]] = {}  # label -> completed durations (s), in order

    @contextmanager
    def time(self, label: str, should_log: bool = True) -> Iterator[None]:
        """Times the body under `label`. The duration is recorded even if the body raises."""
        self.start(label, should_log)
        try:
            yield
        finally:
            self.stop(label, should_log)

    def start(self, label: str, should_log: bool = True) -> None:
        """Starts timing `label`; raises ValueError if it is already running."""
        if not isinstance(label, str) or not label:
            raise ValueError(f"Timer label must be a non-empty string, got {label!r}")
        if label in self._running:
            raise ValueError(
                f"Timer label {label!r} is already running; stop it before starting it again "
                "(nest sections under different labels)"
            )
        self._running[label] = time.perf_counter()
        if should_log:
            log.debug("%s start", label)

    def stop(self, label: str, should_log: bool = True) -> float:
        """Stops timing `label`, records the duration and returns it in seconds; ValueError if it is not running."""
        started = self._running.pop(label, None)
        if started is None:
            running = sorted(self._running) or "none"
            raise ValueError(f"Timer label {label!r} is not running (running labels: {running})")
        elapsed = time.perf_counter() - started
        self._durations.setdefault(label, []).append(elapsed)
        if should_log:
            log.debug("%s end elapsed=%.4fs", label, elapsed)
        return elapsed

    def record(self, label: str, elapsed: float, should_log: bool = True) -> None:
        """Adds a duration measured elsewhere (seconds) to `label`, as if it had been timed here."""
        if not isinstance(label, str) or not label:
            raise ValueError(f"Timer label must be a non-empty string, got {label!r}")
        if not elapsed >= 0:
            raise ValueError(f"Timer.record: elapsed must be >= 0 seconds, got {elapsed!r}")
        self._durations.setdefault(label, []).append(float(elapsed))
        if should_log:
            log.debug("%s record elapsed=%.4fs", label, elapsed)

    def get_durations(self, label: str) -> list[float]:
        """All completed durations of `label` since the last reset, in order (a copy)."""
        if label not in self._durations:
            raise KeyError(f"Timer label {label!r} has no recorded durations (known: {sorted(self._durations)})")
        return list(self._durations[label])

    get_elapsed = get_durations  # NeMo-RL's name

    def get_latest_elapsed(self, label: str) -> float:
        """The most recent duration of `label`; KeyError if it has none."""
        return self.get_durations(label)[-1]

    def reduce(self, label: str, operation: str = "mean") -> float:
        """One reduction (see `REDUCTION_OPS`) of the durations of `label`; ValueError on an unknown operation,
        KeyError on a label without durations."""
        _check_op("operation", operation)
        return _REDUCTIONS[operation](self.get_durations(label))

    @overload
    def get_timing_metrics(self, reduction_op: str = "mean") -> dict[str, float]: ...

    @overload
    def get_timing_metrics(self, reduction_op: Mapping[str, str]) -> dict[str, float | list[float]]: ...

    def get_timing_metrics(
        self, reduction_op: str | Mapping[str, str] = "mean"
    ) -> dict[str, float] | dict[str, float | list[float]]:
        """Every label with at least one completed duration; running sections are not included.

        `reduction_op` is one of `REDUCTION_OPS` ("sum", "mean", "max", "min", "count", "median", "std"), applied to
        every label (one float each), or a mapping label -> op: mapped labels get their reduction, the others all
        their durations as a list.
        """
        if isinstance(reduction_op, str):
            _check_op("reduction_op", reduction_op)
            return {label: _REDUCTIONS[reduction_op](durations) for label, durations in self._durations.items()}
        for label, op in reduction_op.items():
            _check_op(f"reduction_op[{label!r}]", op)
        return {
            label: _REDUCTIONS[reduction_op[label]](durations) if label in reduction_op else list(durations)
            for label, durations in self._durations.items()
        }

    def reset(self, label: str | None = None) -> None:
        """Forgets recorded durations and abandons running sections, for every label or only `label` (a label that
        was never timed is ignored)."""
        if label is None:
            self._durations.clear()
            self._running.clear()
            return
        self._durations.pop(label, None)
        self._running.pop(label, None)


def _check_op(where: str, op: str) -> None:
    if op not in _REDUCTIONS:
        raise ValueError(f"{where} must be one of {list(REDUCTION_OPS)}, got {op!r}")


def convert_to_seconds(time_string: str) -> int:
    """Seconds in a ``"DD:HH:MM:SS"`` duration (e.g. ``"00:03:45:00"`` is 13500); ValueError on another format."""
    return int(parse_deadline(time_string))


class TimeoutChecker:
    """NeMo-RL's save-before-the-job-ends check: `check_save` turns True once (and only once) when ``timeout``
    (``"DD:HH:MM:SS"`` from construction; None: never) has passed, or with ``fit_last_save_time`` when the
    longest iteration seen so far would no longer fit. Call `start_iterations` before the loop and `mark_iteration`
    after each iteration."""

    def __init__(self, timeout: str | None = "00:03:45:00", fit_last_save_time: bool = False) -> None:
        self.last_save_time = float("inf") if timeout is None else parse_deadline(timeout)
        self.fit_last_save_time = fit_last_save_time
        self.start_time = time.monotonic()
        self.last_saved = False
        self.iteration_times: list[float] = []
        self.previous_iteration_time: float | None = None

    def start_iterations(self) -> None:
        self.previous_iteration_time = time.monotonic()

    def mark_iteration(self) -> None:
        now = time.monotonic()
        if self.previous_iteration_time is None:
            raise RuntimeError("TimeoutChecker.mark_iteration: call start_iterations() before the first iteration")
        self.iteration_times.append(now - self.previous_iteration_time)
        self.previous_iteration_time = now

    def check_save(self) -> bool:
        """True the first time the deadline is due; False before and after that."""
        sys.stdout.flush()  # the job may be killed soon: what was printed must reach the log
        sys.stderr.flush()
        if self.last_saved:
            return False
        elapsed = time.monotonic() - self.start_time
        expected = max(self.iteration_times) if self.fit_last_save_time and self.iteration_times else 0.0
        if elapsed + expected >= self.last_save_time:
            self.last_saved = True
            return True
        return False


def timed(timer: Timer | None, label: str) -> AbstractContextManager[None]:
    """``timer.time(label)``, or nothing when there is no timer (NeMo-RL's optional ``timer`` arguments)."""
    return nullcontext() if timer is None else timer.time(label)
