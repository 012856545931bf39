"""The directories a run writes (``logger.log_dir``, ``checkpointing.checkpoint_dir``): checked writable before the
run starts, and removed again when the start fails, so a failed start leaves no half-made ``exp_N`` behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path


def check_writable_dir(path: str | os.PathLike, key: str) -> str | None:
    """None if ``path`` is, or can be created as, a writable directory; else one line naming ``key``."""
    target = Path(path).expanduser().absolute()
    if target.exists() and not target.is_dir():
        return f"{key}: {str(path)!r} exists and is not a directory"
    existing = target
    while not existing.exists():  # the nearest ancestor that exists is where the first mkdir happens
        existing = existing.parent
    if not existing.is_dir():
        return f"{key}: cannot create {str(path)!r}: {str(existing)!r} is not a directory"
    try:  # a real probe: permission bits say nothing for root, nor for read-only or virtual filesystems
        tempfile.TemporaryDirectory(dir=existing, prefix=".nrl-write-probe-").cleanup()
    except OSError as error:
        what = "is not writable" if existing == target else f"cannot be created ({str(existing)!r} is not writable)"
        return f"{key}: {str(path)!r} {what}: {error.strerror}"
    return None


@contextlib.contextmanager
def removed_if_start_fails(paths: Sequence[str | os.PathLike], before_removal: Callable[[], None]) -> Iterator[None]:
    """Undo what a failed start created under ``paths``: a path that did not exist is removed; in one that did,
    every entry that appeared meanwhile is (e.g. the new ``exp_N``). ``before_removal`` runs first (e.g. stopping
    Ray, whose session dir may live in the new log dir). Entries that existed before are never touched."""
    before = {Path(p).absolute(): _entries(Path(p).absolute()) for p in paths}
    existing_ancestors = {path: _nearest_existing(path) for path in before}
    try:
        yield
    except BaseException:
        before_removal()
        for path, entries in before.items():
            if entries is None:
                _remove_created(path, existing_ancestors[path])
            else:
                for entry in _entries(path) or set():
                    if entry not in entries:
                        _remove(path / entry)
        raise


def _entries(path: Path) -> set[str] | None:
    return set(os.listdir(path)) if path.is_dir() else None


def _nearest_existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def _remove_created(path: Path, existing_ancestor: Path) -> None:
    """Remove ``path``, then its parents up to ``existing_ancestor`` (exclusive) while they are empty."""
    _remove(path)
    for parent in path.parents:
        if parent == existing_ancestor or not parent.is_relative_to(existing_ancestor):
            break
        try:
            parent.rmdir()
        except OSError:  # not empty: something else lives there now
            break


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
