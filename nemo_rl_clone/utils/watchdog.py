"""A stalled worker is a fault: the driver's progress watchdog (the ``watchdog`` config section, ours).

Each phase a run announces (`progress.phase`: generation, logprobs, training, weight sync, validation, checkpoint,
...) is timed. A phase that runs longer than ``warn_factor`` × the median of its earlier runs, and at least
``warn_min_s``, is named once on stderr, with the worker calls it still waits on (actor name, pid, method, how long)
and each such worker's stack from py-spy in ``<log_dir>/watchdog/``. Past ``stop_factor`` × the median, and at least
``stop_min_s``, the run stops: one line on stderr, exit code `WATCHDOG_EXIT_CODE`, the last complete checkpoint
kept, and the reaper ends every process the run started. A phase seen for the first time has only the minimums.

Worker calls are those dispatched through `RayWorkerGroup` (engines, policy and reference workers), and the
environment and agent actors' calls the rollout makes (`track_actor`: named by their Ray actor name or class and
their pid, which Ray's control store knows even when the actor cannot answer); they are tracked only while a
watchdog runs.
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from nemo_rl_clone.utils.config_validation import SectionReads
from nemo_rl_clone.utils.errors import report_fault

WATCHDOG_EXIT_CODE = 124  # what `timeout` returns when its command ran out of time


@dataclass
class WatchdogConfig(SectionReads):
    """The ``watchdog`` section. The defaults never fire on a healthy run: a first compile or a first save can take
    minutes, so the minimums are generous; tests and impatient users lower them."""

    enabled: bool = True  # false: no watchdog
    warn_factor: float = 5.0  # warn once when a phase runs longer than this × its median so far
    warn_min_s: float = 300.0  # and at least this many seconds
    stop_factor: float = 20.0  # stop the run (exit code 124) past this × the median
    stop_min_s: float = 1800.0  # and at least this many seconds
    poll_s: float = 1.0  # seconds between two checks of the bounds
    # Seconds a trainer rank waits in one torch.distributed collective (its process groups' timeout) before it fails
    # and the run stops naming it; null: torch's default (gloo 30 min, NCCL 10 min).
    collective_timeout_s: float | None = None

    def check(self) -> list[tuple[str, str]]:
        problems = [
            (key, f"must be > 0, got {getattr(self, key)}")
            for key in ("warn_factor", "warn_min_s", "stop_factor", "stop_min_s", "poll_s")
            if not getattr(self, key) > 0
        ]
        if self.collective_timeout_s is not None and not self.collective_timeout_s > 0:
            problems.append(("collective_timeout_s", f"must be > 0 or null, got {self.collective_timeout_s}"))
        if not problems and self.stop_min_s < self.warn_min_s:
            problems.append(("stop_min_s", f"must be >= warn_min_s ({self.warn_min_s}), got {self.stop_min_s}"))
        if not problems and self.stop_factor < self.warn_factor:
            problems.append(("stop_factor", f"must be >= warn_factor ({self.warn_factor}), got {self.stop_factor}"))
        return problems


# What a tracked call is: a label with its pid (a worker-group call: ``"vllm_policy-0 (pid 123) generate"``), or an
# actor's id and the method, named when a stall is reported (`_actor_label`).
_Call = tuple[str, int | None, str | None]


class PendingCalls:
    """Calls in flight: their result refs and what they are."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[Any, tuple[_Call, float]] = {}

    def add(self, ref: Any, label: str, pid: int | None, actor_id: str | None = None) -> None:
        with self._lock:
            self._calls[ref] = ((label, pid, actor_id), time.monotonic())

    def waiting(self) -> list[tuple[str, int | None, float]]:
        """The calls not finished yet (label, pid, seconds running), longest first; finished ones are forgotten."""
        import ray

        with self._lock:
            refs = list(self._calls)
        if not refs:
            return []
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        now = time.monotonic()
        with self._lock:
            for ref in done:
                self._calls.pop(ref, None)
            left = list(self._calls.values())
        named = [(*_named(call), now - started) for call, started in left]
        return sorted(named, key=lambda c: -c[2])


def _named(call: _Call) -> tuple[str, int | None]:
    label, pid, actor_id = call
    return (label, pid) if actor_id is None else _actor_label(actor_id, label)


def _actor_label(actor_id: str, method: str) -> tuple[str, int | None]:
    """``"<actor name or class> (pid P) <method>"`` from Ray's actor table, which the GCS keeps: asking the actor
    itself would hang on the stalled one. A restarted actor has its current pid there."""
    import ray

    try:
        info = ray._private.state.actors(actor_id)  # the public state API needs the dashboard, which runs may lack
    except Exception:
        info = {}
    pid = int(info["Pid"]) if info.get("Pid") else None
    name = info.get("Name") or info.get("ActorClassName") or f"actor {actor_id[:8]}"
    return f"{name} (pid {pid}) {method}", pid


_pending: PendingCalls | None = None  # set while a watchdog runs
_current: Watchdog | None = None


def _children(pid: int | None) -> list[psutil.Process]:
    """The worker's descendant processes on this machine (an engine's rank processes), or none."""
    if pid is None:
        return []
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:  # gone, or not a process of this machine's
        return []


def _stopped(children: list[psutil.Process]) -> str:
    """``" (its process P (title) is stopped)"`` for the children stopped by a signal: the rank that holds the rest."""
    stopped = []
    for child in children:
        with contextlib.suppress(psutil.Error):
            if child.status() == psutil.STATUS_STOPPED:
                stopped.append(f"{child.pid} ({' '.join(child.cmdline())[:40].strip()})")
    return f" (its process {', '.join(stopped)} is stopped)" if stopped else ""


def running() -> bool:
    return _pending is not None


def track(ref: Any, label: str, pid: int | None) -> None:
    """Note a worker call's result ref (`RayWorkerGroup` does, for every call); nothing without a watchdog."""
    if _pending is not None and hasattr(ref, "hex"):  # an ObjectRef (not a streaming generator)
        _pending.add(ref, label, pid)


def track_actor(ref: Any, actor: Any, method: str) -> None:
    """Note the result ref of a call to a Ray ``actor`` handle outside the worker groups (an environment's step, an
    agent's episodes); nothing without a watchdog."""
    if _pending is not None and hasattr(ref, "hex"):
        actor_id = getattr(actor, "_actor_id", None)  # a Ray actor handle's; anything else is named by method alone
        _pending.add(ref, method, None, actor_id.hex() if actor_id is not None else None)


def at_phase(step: int, name: str) -> None:
    if _current is not None:
        _current.start_phase(step, name)


def at_step_end() -> None:
    if _current is not None:
        _current.end_phase()


class Watchdog:
    def __init__(self, cfg: WatchdogConfig, log_dir: Path, describe: Callable[[], str]) -> None:
        self.cfg = cfg
        self.stacks_dir = log_dir / "watchdog"
        self.describe = describe  # the last complete checkpoint and the resume command
        self.pending = PendingCalls()
        self.durations: dict[str, list[float]] = defaultdict(list)
        self._lock = threading.Lock()
        self._phase: tuple[int, str, float] | None = None
        self._warned = False
        self._stop = threading.Event()

    def start_phase(self, step: int, name: str) -> None:
        with self._lock:
            self._finish()
            self._phase, self._warned = (step, name, time.monotonic()), False

    def end_phase(self) -> None:
        with self._lock:
            self._finish()
            self._phase = None

    def _finish(self) -> None:
        if self._phase is not None:
            _, name, started = self._phase
            self.durations[name].append(time.monotonic() - started)

    def bounds(self, name: str) -> tuple[float, float]:
        """(warn, stop) seconds for phase ``name``, from its earlier durations."""
        earlier = self.durations.get(name)
        median = statistics.median(earlier) if earlier else 0.0
        return (
            max(self.cfg.warn_factor * median, self.cfg.warn_min_s),
            max(self.cfg.stop_factor * median, self.cfg.stop_min_s),
        )

    def check(self) -> None:
        """One look: warn or stop if the current phase has outrun its bounds."""
        with self._lock:
            if self._phase is None:
                return
            step, name, started = self._phase
            elapsed = time.monotonic() - started
            warn_s, stop_s = self.bounds(name)
            warn = elapsed > warn_s and not self._warned
            self._warned |= warn
        if elapsed > stop_s:
            self._stop_run(step, name, elapsed, stop_s)
        elif warn:
            report_fault(
                f"watchdog: step {step} {name} has run {elapsed:.0f} s (warns after {warn_s:.0f} s, stops the run "
                f"after {stop_s:.0f} s): {self._stalled(step)}"
            )

    def _stalled(self, step: int) -> str:
        """Which worker calls the driver still waits on, with their stacks saved; or that it waits on none."""
        calls = self.pending.waiting()
        if not calls:
            return "no worker call pending (the driver itself)"
        named = []
        for label, pid, running in calls[:4]:
            children = _children(pid)
            stack = self._save_stack(step, label, [pid, *(child.pid for child in children)] if pid else [])
            named.append(f"{label} for {running:.0f} s{_stopped(children)}" + (f" (stack: {stack})" if stack else ""))
        more = f" and {len(calls) - 4} more" if len(calls) > 4 else ""
        return "waiting on " + "; ".join(named) + more

    def _save_stack(self, step: int, label: str, pids: list[int]) -> Path | None:
        """py-spy's dump of the worker and of its child processes (an engine's ranks), in one file."""
        py_spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
        if not pids or py_spy is None:
            return None
        dumps = []
        for each in pids[:8]:
            try:  # --nonblocking: a stopped or stuck process is read without pausing it
                dump = subprocess.run(
                    [py_spy, "dump", "--pid", str(each), "--nonblocking"], capture_output=True, text=True, timeout=20
                )
            except (OSError, subprocess.TimeoutExpired):
                continue
            dumps.append(dump.stdout + dump.stderr)
        if not dumps:
            return None
        self.stacks_dir.mkdir(parents=True, exist_ok=True)
        path = self.stacks_dir / f"step_{step}_{label.split()[0]}.txt"
        path.write_text("\n".join(dumps))
        return path

    def _stop_run(self, step: int, name: str, elapsed: float, stop_s: float) -> None:
        from nemo_rl_clone.utils.signals import force_exit

        force_exit(
            WATCHDOG_EXIT_CODE,
            f"Stopped by the watchdog: step {step} {name} made no progress for {elapsed:.0f} s (bound {stop_s:.0f} "
            f"s): {self._stalled(step)}; {self.describe()}",
        )

    def _loop(self) -> None:
        while not self._stop.wait(self.cfg.poll_s):
            self.check()


@contextmanager
def watching(cfg: WatchdogConfig, log_dir: Path, describe: Callable[[], str]) -> Iterator[Watchdog | None]:
    """Run the block under a watchdog (none when ``cfg.enabled`` is false)."""
    global _pending, _current
    if not cfg.enabled:
        yield None
        return
    dog = Watchdog(cfg, log_dir, describe)
    _pending, _current = dog.pending, dog
    thread = threading.Thread(target=dog._loop, name="watchdog", daemon=True)
    thread.start()
    try:
        yield dog
    finally:
        dog._stop.set()
        thread.join()
        _pending, _current = None, None
