"""One run per checkpoint directory: an advisory lock file, ``<checkpoint_dir>/run.lock``, held for the run's life.

The file is created with ``O_CREAT | O_EXCL`` (atomic on local filesystems and on NFSv3 and later) and holds the
holder's host, pid, process start time and wall-clock start. A second run refuses in one line naming the holder. A
lock left by a process of *this host* that is gone (its pid is not running, or runs another program started at
another time) is taken over with a notice. A lock of another host is never taken over: this process cannot tell
whether that run is alive; the refusal says which file to remove once it is not.

Limits: hosts are told apart by hostname, so two containers with the same hostname and separate pid namespaces look
like one host; a holder killed on another host leaves its lock behind until removed by hand.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from nemo_rl_clone.utils.errors import UserInputError

LOCK_FILE = "run.lock"


class CheckpointDirInUse(UserInputError):
    """Another live run holds the checkpoint directory's lock."""


def _process_start_ticks(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot); None when no such process is running (a zombie,
    killed but not yet reaped by its parent, has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # fields 3.. (the name before may hold spaces and parentheses)
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _me() -> dict[str, Any]:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_start_ticks": _process_start_ticks(os.getpid()),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def _describe(holder: dict[str, Any]) -> str:
    return f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}"


class CheckpointDirLock:
    """``acquire()`` once at start (a `CheckpointDirInUse` if another live run holds it); released at exit."""

    def __init__(self, checkpoint_dir: Path) -> None:
        self.path = Path(checkpoint_dir) / LOCK_FILE
        self.record = _me()
        self.held = False

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # a holder that releases between our create and our read: try again
            if self._create():
                break
            holder = self._read()
            if holder is None:
                continue
            if self._is_mine(holder):
                break
            if not self._holder_gone(holder):
                raise CheckpointDirInUse(
                    f"checkpointing.checkpoint_dir {self.path.parent} is in use by another run ({_describe(holder)}; "
                    f"lock file {self.path}): wait for it to end, or use another checkpoint_dir; remove the lock file "
                    "only if that run is gone"
                )
            self._take_over(holder)
        else:
            raise CheckpointDirInUse(f"could not take the lock {self.path}: it keeps changing hands")
        self.held = True
        atexit.register(self.release)

    def release(self) -> None:
        """Remove the lock file if it is still this process's (idempotent; forked children never remove it)."""
        if self.held and os.getpid() == self.record["pid"]:
            holder = self._read()
            if holder is not None and self._is_mine(holder):
                with contextlib.suppress(OSError):
                    self.path.unlink()
            self.held = False

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as out:
            json.dump(self.record, out)
            out.flush()
            os.fsync(out.fileno())
        return True

    def _read(self) -> dict[str, Any] | None:
        try:
            holder = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {"host": "?", "pid": "?", "started": "? (unreadable lock file)"}
        return holder if isinstance(holder, dict) else {"host": "?", "pid": "?", "started": "?"}

    def _is_mine(self, holder: dict[str, Any]) -> bool:
        keys = ("host", "pid", "pid_start_ticks")
        return all(holder.get(key) == self.record[key] for key in keys)

    def _holder_gone(self, holder: dict[str, Any]) -> bool:
        if holder.get("host") != self.record["host"] or not isinstance(holder.get("pid"), int):
            return False
        ticks = _process_start_ticks(holder["pid"])
        return ticks is None or ticks != holder.get("pid_start_ticks")

    def _take_over(self, holder: dict[str, Any]) -> None:
        print(
            f"Taking over the lock {self.path} of a run that is gone ({_describe(holder)}; that process no longer "
            "runs)",
            flush=True,
        )
        tmp = self.path.with_name(f"{LOCK_FILE}.{os.getpid()}")
        tmp.write_text(json.dumps(self.record))
        os.replace(tmp, self.path)  # a racing taker may replace it again; the loop's re-read settles who holds it
        now = self._read()
        if now is None or not self._is_mine(now):
            raise CheckpointDirInUse(
                f"checkpointing.checkpoint_dir {self.path.parent} was taken by another run while this one took over "
                f"a stale lock ({_describe(now or {})})"
            )
