"""When a run checkpoints: every ``checkpointing.save_period`` steps, at the end, and before the
``checkpoint_must_save_by`` budget runs out."""

from __future__ import annotations

import re
import time
from typing import Protocol

_DEADLINE_RE = re.compile(r"^(\d+):(\d+):(\d+):(\d+)$")
_DEADLINE_FORMAT_HINT = "expected 'DD:HH:MM:SS' (e.g. '00:03:45:00' = 3 h 45 min after the run starts)"


class SaveSchedule(Protocol):
    """The keys of `checkpoint.CheckpointingConfig` read here (not imported: that module imports this one)."""

    enabled: bool
    save_period: int
    checkpoint_must_save_by: str | None


def should_save(step: int, cfg: SaveSchedule, is_last_step: bool) -> bool:
    """Whether to checkpoint after ``step`` (1-based count of completed steps): every ``save_period`` and at the end."""
    return cfg.enabled and (is_last_step or step % cfg.save_period == 0)


def parse_deadline(s: str) -> float:
    """Seconds in a ``"DD:HH:MM:SS"`` duration; ``ValueError`` naming the format on anything else."""
    match = _DEADLINE_RE.match(s.strip()) if isinstance(s, str) else None
    if match is None:
        raise ValueError(f"bad deadline {s!r}: {_DEADLINE_FORMAT_HINT}")
    days, hours, minutes, seconds = (int(g) for g in match.groups())
    for value, limit, unit in ((hours, 24, "hours"), (minutes, 60, "minutes"), (seconds, 60, "seconds")):
        if value >= limit:
            raise ValueError(f"bad deadline {s!r}: {unit} must be < {limit}; {_DEADLINE_FORMAT_HINT}")
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def must_save_by_deadline(
    cfg: SaveSchedule, start_time: float, now: float | None = None, expected_step_s: float = 0.0
) -> bool:
    """True when the run must save and stop now to respect ``checkpoint_must_save_by``.

    ``start_time`` and ``now`` are ``time.monotonic()`` readings. ``expected_step_s`` is how long the next step
    (plus its save) is expected to take: the check fires when finishing it would cross the deadline. Always False
    when checkpointing is disabled or no deadline is set.
    """
    if not cfg.enabled or cfg.checkpoint_must_save_by is None:
        return False
    now = time.monotonic() if now is None else now
    return (now - start_time) + expected_step_s >= parse_deadline(cfg.checkpoint_must_save_by)


class SaveDeadline:
    """Tracks step durations so a train loop can stop one step early rather than one step late.

    Usage: ``deadline = SaveDeadline(cfg)`` at start; after each step ``deadline.mark_step()``; then
    ``if deadline.reached(): save and stop``. Uses the longest step seen as the estimate of the next one.
    """

    def __init__(self, cfg: SaveSchedule, start_time: float | None = None):
        self._cfg = cfg
        self.start_time = time.monotonic() if start_time is None else start_time
        self._last_mark = self.start_time
        self.longest_step_s = 0.0

    def mark_step(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.longest_step_s = max(self.longest_step_s, now - self._last_mark)
        self._last_mark = now

    def reached(self, now: float | None = None) -> bool:
        return must_save_by_deadline(self._cfg, self.start_time, now, expected_step_s=self.longest_step_s)
