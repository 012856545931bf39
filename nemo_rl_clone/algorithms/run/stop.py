"""Stopping a training loop on Ctrl-C or SIGTERM (`utils.signals`), the same way for GRPO, SFT, DPO and RM.

    with stop_on_signals(checkpointer, state, dataloader, save, grace_s):
        _run_steps(...)

- Ctrl-C: the step in flight is abandoned; debris of a save it cut is removed; one line names the last complete
  checkpoint and the command that resumes; the process exits with 130.
- A Ray worker dies (an engine, a trainer rank, an environment), or a trainer rank's collective outlives
  ``watchdog.collective_timeout_s`` (a peer never joined it): one line names it, the last complete checkpoint and the
  command that resumes; exit code 1.
- A checkpoint the disk cannot hold, with ``checkpointing.on_save_failure: stop`` (`save_guard`): one line naming
  the directory, the reason and the last complete checkpoint; exit code 74.
- A phase that makes no progress past the watchdog's stop bound (`utils.watchdog`): one line names the phase and
  the worker calls still pending; exit code 124.
- SIGTERM: at the next phase boundary the last *completed* step is saved if no checkpoint holds it yet and the grace
  period leaves time for a save as long as the longest one seen; then one line, and exit code 143. A step in flight
  is dropped: the loader position and RNG states saved are those of its start (`_ResumePoint`), so a resumed run
  redoes exactly that step.
"""

from __future__ import annotations

import random
import re
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, Protocol

import numpy as np
import torch

from nemo_rl_clone.algorithms.run.save_guard import SAVE_FAILED_EXIT_CODE, SaveFailed
from nemo_rl_clone.algorithms.run.state import RunState
from nemo_rl_clone.distributed.oom import oom_cause, remember_oom_kills
from nemo_rl_clone.distributed.reaper import register_checkpoint_dir
from nemo_rl_clone.utils.checkpoint import CheckpointManager, remove_save_debris
from nemo_rl_clone.utils.errors import find_user_input_error, report_fault
from nemo_rl_clone.utils.signals import EXIT_CODE, StopRequested, force_exit, handle_stop_signals
from nemo_rl_clone.utils.watchdog import WatchdogConfig, watching

# Before any save has been timed, assume one takes this long (a SmolLM2-sized save on CPU takes a few seconds).
_DEFAULT_SAVE_S = 10.0


class LoaderPosition(Protocol):
    """Where a run is in its data: what a checkpoint saves and a resume restores (a `StatefulPromptLoader`, or async
    GRPO's position of the last trained rollouts)."""

    @property
    def completed_epochs(self) -> int: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class _ResumePoint:
    """Follows the phases: keeps the loader position and RNG states at the start of the step in flight (what a
    checkpoint of the step before it must hold) and how long the longest checkpoint phase took."""

    def __init__(self, dataloader: LoaderPosition) -> None:
        self.dataloader = dataloader
        self.step: int | None = None
        self.saved: dict[str, Any] = {}
        self.longest_save_s = _DEFAULT_SAVE_S
        self._save_started: float | None = None

    def on_phase(self, step: int, name: str) -> None:
        now = time.monotonic()
        if self._save_started is not None:
            self.longest_save_s = max(self.longest_save_s, now - self._save_started)
        self._save_started = now if name == "checkpoint" else None
        if step != self.step:
            self.capture(step)

    def capture(self, step: int) -> None:
        self.step = step
        self.saved = {
            "dataloader": self.dataloader.state_dict(),
            "rng": (random.getstate(), np.random.get_state(), torch.get_rng_state()),
        }

    def restore(self) -> None:
        self.dataloader.load_state_dict(self.saved["dataloader"])
        python, numpy, torch_state = self.saved["rng"]
        random.setstate(python)
        np.random.set_state(numpy)
        torch.set_rng_state(torch_state)


def worker_death(error: BaseException) -> str | None:
    """One line naming the Ray worker whose death ``error`` reports (directly or as the cause of another error,
    e.g. async GRPO's `CollectorError`), and the OOM killer that took it if one did; None when it is not a worker
    death."""
    import ray

    while error is not None and not isinstance(error, ray.exceptions.RayActorError):
        error = error.__cause__  # type: ignore[assignment]
    if error is None:
        return None
    text = str(error)
    fields = dict(re.findall(r"^\s*(class_name|name|pid): (\S+)", text, flags=re.MULTILINE))
    who = " ".join(f"{key} {fields[key]}" for key in ("name", "pid") if key in fields) or "unknown"
    line = f"a {fields.get('class_name', 'Ray')} worker died ({who}): {type(error).__name__}"
    return line + oom_cause(text)


# What gloo and NCCL say when a collective outlives its group's timeout (``watchdog.collective_timeout_s``).
_COLLECTIVE_TIMEOUT = re.compile(
    r"Timed out waiting \d+ ?ms for \w+ operation[^\n]*|collective operation timeout[^\n]*"
)


def collective_timeout(error: BaseException) -> str | None:
    """One line for a worker whose torch.distributed collective timed out (a peer rank never joined it): which
    worker call (the note `get_fail_fast` adds) and torch's own words; None when ``error`` is something else."""
    found = None
    while error is not None and found is None:  # the worker's error may be the cause of the one raised here
        found = _COLLECTIVE_TIMEOUT.search(str(error))
        if found is None:
            error = error.__cause__  # type: ignore[assignment]
    if found is None:
        return None
    where = next((note for note in getattr(error, "__notes__", []) if note.startswith("raised by ")), "")
    who = f" ({where})" if where else ""
    return f"a collective timed out{who}: {found.group(0).strip()} (watchdog.collective_timeout_s)"


def stopped_worker(error: BaseException) -> str | None:
    """`worker_death` or `collective_timeout`: the line a worker fault ends the run with."""
    return worker_death(error) or collective_timeout(error)


def stop_for_worker_fault(error: BaseException, line: str) -> NoReturn:
    """End the run on a worker fault, with ``line`` on stderr and exit code 1. A collective that timed out leaves its
    peer stuck, not dead: a graceful shutdown would wait on it (a cleanup call, then Ray's kill: ~90 s), so the run
    exits at once and the reaper ends its processes, as on the watchdog's stop."""
    if worker_death(error) is None and collective_timeout(error) is not None:
        force_exit(1, line)
    report_fault(line)
    raise SystemExit(1) from None


@contextmanager
def stop_on_worker_death(during: str) -> Iterator[None]:
    """A worker that dies in the block (e.g. while the run starts) ends the run in one line and exit code 1."""
    remember_oom_kills()
    try:
        yield
    except Exception as error:
        died = stopped_worker(error)
        if died is None or find_user_input_error(error) is not None:  # bad input: `reporting_user_errors` says it
            raise
        stop_for_worker_fault(error, f"Stopped during {during}: {died}. Resume: {resume_command()}")


def resume_command() -> str:
    """The command line that started this run: run again, it resumes from the latest checkpoint."""
    script = Path(sys.argv[0])
    return shlex.join(["uv", "run", str(script), *sys.argv[1:]])


@contextmanager
def stop_on_signals(
    checkpointer: CheckpointManager,
    state: RunState,
    dataloader: LoaderPosition,
    save: Callable[[], Path | None],
    grace_s: float,
    watchdog: WatchdogConfig | None = None,
    log_dir: Path | None = None,
) -> Iterator[None]:
    """Run the block (a training loop) under the Ctrl-C / SIGTERM handling described above, and under ``watchdog``
    (its stacks under ``log_dir``) when given."""
    resume_point = _ResumePoint(dataloader)

    def describe() -> str:
        latest = checkpointer.get_latest_checkpoint_path() if checkpointer.cfg.enabled else None
        where = f"last complete checkpoint: {latest}" if latest else "no complete checkpoint"
        return f"{where}. Resume: {resume_command()}"

    register_checkpoint_dir(checkpointer.checkpoint_dir)
    with (
        handle_stop_signals(grace_s, resume_point.on_phase, describe) as signals,
        watching(watchdog or WatchdogConfig(enabled=False), log_dir or Path("."), describe),
    ):
        try:
            yield
        except KeyboardInterrupt:  # `RunInterrupted`, or the plain KeyboardInterrupt ray.get makes of it
            remove_save_debris(checkpointer.checkpoint_dir)
            report_fault(f"Stopped by Ctrl-C during step {state.step + 1}; {describe()}")
            raise SystemExit(EXIT_CODE[signal.SIGINT]) from None
        except StopRequested as stop:
            latest = checkpointer.get_latest_checkpoint_path() if checkpointer.cfg.enabled else None
            saved_step = CheckpointManager.load_training_info(latest)["step"] if latest else 0
            note = "nothing new to save"
            if checkpointer.cfg.enabled and state.step > saved_step:
                if signals.grace_left() > resume_point.longest_save_s:
                    if resume_point.step == state.step + 1:  # the step in flight moved the loader and RNGs
                        resume_point.restore()
                    try:
                        note = f"saved step {state.step}" if save() is not None else "nothing saved"
                    except SaveFailed as failed:
                        note = str(failed)
                else:
                    note = f"step {state.step} not saved (the grace period left is shorter than a save)"
            report_fault(f"Stopped by SIGTERM ({stop}): {note}; {describe()}")
            raise SystemExit(EXIT_CODE[signal.SIGTERM]) from None
        except SaveFailed as failed:
            report_fault(f"Stopped after step {state.step}: {failed}. Resume: {resume_command()}")
            raise SystemExit(SAVE_FAILED_EXIT_CODE) from None
        except Exception as error:
            died = stopped_worker(error)
            if died is None:
                raise
            remove_save_debris(checkpointer.checkpoint_dir)
            stop_for_worker_fault(error, f"Stopped during step {state.step + 1}: {died}; {describe()}")
