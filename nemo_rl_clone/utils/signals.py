"""How a training run reacts to Ctrl-C (SIGINT) and to SIGTERM (a scheduler's notice before SIGKILL).

- First SIGINT: `RunInterrupted` (a KeyboardInterrupt) is raised in the main thread at once, whatever phase runs;
  the run stops without saving. A second SIGINT, or the stop still running after ``INTERRUPT_DEADLINE_S``, exits the
  process immediately (the reaper of `distributed.reaper` then kills what the run started).
- SIGTERM: nothing is interrupted; `StopRequested` is raised at the next phase boundary (`at_phase`, called by
  `progress.phase`), so the caller can save the last completed step and exit. If the run is still alive
  ``grace_s`` after the signal, the process exits immediately without saving more.

`handle_stop_signals` installs the handlers for the duration of a training loop; `algorithms.run.stop` uses it.
Why our own handlers: Ray's ``ray.init`` replaces SIGTERM's handler with ``sys.exit`` raised wherever the driver is
(and Ray's C++ core dumps a native stack on SIGTERM when it is not handled in Python), which neither saves nor
bounds the time to stop.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from nemo_rl_clone.utils.errors import report_fault

# A Ctrl-C must end the run within 10 s; an orderly stop that takes longer is cut short here.
INTERRUPT_DEADLINE_S = 5.0
EXIT_CODE = {signal.SIGINT: 128 + signal.SIGINT, signal.SIGTERM: 128 + signal.SIGTERM}


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C: the run stops now, without saving."""


class StopRequested(Exception):
    """SIGTERM arrived: the run stops at this phase boundary (saving the last completed step if there is time)."""


@dataclass
class StopState:
    """What the handlers recorded; ``describe()`` names the last complete checkpoint and how to resume."""

    grace_s: float
    on_phase: Callable[[int, str], None]
    describe: Callable[[], str]
    sigterm_at: float | None = None
    interrupts: int = 0
    timers: list[threading.Timer] = field(default_factory=list)

    def grace_left(self) -> float:
        if self.sigterm_at is None:
            return float("inf")
        return self.grace_s - (time.monotonic() - self.sigterm_at)


_state: StopState | None = None


def force_exit(code: int, line: str) -> None:
    """Exit now, from any thread, without unwinding; the reaper kills the run's processes and removes its files."""
    report_fault(line)
    os._exit(code)


def _arm(state: StopState, after_s: float, code: int, line: Callable[[], str]) -> None:
    timer = threading.Timer(max(0.0, after_s), lambda: force_exit(code, line()))
    timer.daemon = True  # never keeps a finished run alive
    timer.start()
    state.timers.append(timer)


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    state = _state
    if state is None:
        raise KeyboardInterrupt
    state.interrupts += 1
    if state.interrupts > 1:
        force_exit(EXIT_CODE[signal.SIGINT], f"Second Ctrl-C: exiting now; {state.describe()}")
    report_fault("Ctrl-C: stopping now without saving (press Ctrl-C again to exit at once).")
    _arm(
        state,
        INTERRUPT_DEADLINE_S,
        EXIT_CODE[signal.SIGINT],
        lambda: f"Ctrl-C: stopping took over {INTERRUPT_DEADLINE_S:g} s, exiting now; {state.describe()}",
    )
    raise RunInterrupted


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    state = _state
    if state is None or state.sigterm_at is not None:
        return
    state.sigterm_at = time.monotonic()
    report_fault(f"SIGTERM: stopping at the next phase boundary and saving (grace period {state.grace_s:g} s).")
    _arm(
        state,
        state.grace_s,
        EXIT_CODE[signal.SIGTERM],
        lambda: f"SIGTERM: grace period of {state.grace_s:g} s over, exiting without saving; {state.describe()}",
    )


def at_phase(step: int, name: str) -> None:
    """Called as each phase starts: tells the stop handling (``on_phase``), and raises `StopRequested` once SIGTERM
    has arrived."""
    state = _state
    if state is None:
        return
    state.on_phase(step, name)
    if state.sigterm_at is not None:
        raise StopRequested(f"SIGTERM before step {step}: {name}")


@contextmanager
def handle_stop_signals(
    grace_s: float, on_phase: Callable[[int, str], None], describe: Callable[[], str]
) -> Iterator[StopState]:
    """Install the SIGINT / SIGTERM handlers above inside the block (main thread only). A block that ends normally
    restores the previous handlers; one that ends by an exception (a stop) keeps them and the armed force-exit
    timers, so that the shutdown after it is bounded too and a second Ctrl-C still exits at once."""
    global _state
    if threading.current_thread() is not threading.main_thread():
        yield StopState(grace_s, on_phase, describe)  # signals are delivered to the main thread only
        return
    state = StopState(grace_s, on_phase, describe)
    previous: dict[int, Any] = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    _state = state
    signal.signal(signal.SIGINT, _on_sigint)
    signal.signal(signal.SIGTERM, _on_sigterm)
    yield state
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    _state = None
