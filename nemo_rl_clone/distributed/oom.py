"""Whether an OOM killer took a worker: Ray's memory monitor names itself in the death's message, the kernel's OOM
killer only shows in the memory cgroup's kill counter (cgroup v2 ``memory.events``, v1 ``memory.oom_control``).
Imports nothing heavy, so that it can run inside a small memory cgroup."""

from __future__ import annotations

import contextlib
from pathlib import Path

# Ray's memory monitor says so in the death's message; the kernel's OOM killer only shows in the cgroup's counter.
_RAY_OOM_MARKS = ("memory pressure", "running low on memory", "OutOfMemoryError")
_oom_kills_at_start: int | None = None


def oom_kill_count() -> int | None:
    """How many processes the kernel's OOM killer has killed in this process's memory cgroup; None where the
    cgroup does not say."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            candidates = [
                Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.events",
                Path("/sys/fs/cgroup/memory.events"),
            ]
        elif "memory" in controllers.split(","):
            root = Path("/sys/fs/cgroup/memory")
            candidates = [root / path.lstrip("/") / "memory.oom_control", root / "memory.oom_control"]
        else:
            continue
        for candidate in candidates:
            with contextlib.suppress(OSError, ValueError):
                counts = dict(row.split() for row in candidate.read_text().splitlines())
                if "oom_kill" in counts:
                    return int(counts["oom_kill"])
    return None


def remember_oom_kills() -> None:
    """Note the OOM killer's count at the start of a run, so a later worker death can tell whether it fired."""
    global _oom_kills_at_start
    _oom_kills_at_start = oom_kill_count()


def oom_cause(text: str) -> str:
    """``", killed by ..."`` naming the OOM killer behind a worker death whose Ray message is ``text``; "" when none
    is known to have fired."""
    if any(mark in text for mark in _RAY_OOM_MARKS):
        return ", killed by Ray's memory monitor (the node ran low on memory)"
    now = oom_kill_count()
    if _oom_kills_at_start is not None and now is not None and now > _oom_kills_at_start:
        return f", killed by the kernel's OOM killer (its kill count in this cgroup rose from {_oom_kills_at_start} to {now})"
    return ""
