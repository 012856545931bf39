"""Filesystem steps of a crash-safe checkpoint save: fsync a tree, and put a directory in place without ever losing
both the old and the new one (see `nemo_rl_clone.utils.checkpoint`)."""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
from pathlib import Path


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (directories too, so their entries are durable)."""
    for dirpath, _, filenames in os.walk(root):
        for filename in filenames:
            file_path = Path(dirpath, filename)
            if not file_path.is_symlink():
                fsync_path(file_path)
        fsync_path(Path(dirpath))


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def _exchange_dirs(a: Path, b: Path) -> bool:
    """Atomically swap two directory entries (Linux ``renameat2(RENAME_EXCHANGE)``); False if unsupported."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(err, f"exchanging {a} and {b}: {os.strerror(err)}")


def replace_dir(new: Path, dest: Path, use_exchange: bool = True) -> None:
    """Put directory ``new`` at ``dest``, replacing a directory already there, without ever losing both.

    With an atomic exchange ``dest`` always names a complete directory. Without one the old directory sits at
    ``old_<dest>`` for the instant between two renames; `CheckpointManager` restores it after a crash there.
    """
    if not dest.exists():
        os.rename(new, dest)
        return
    if use_exchange and _exchange_dirs(new, dest):
        shutil.rmtree(new)  # now holds the old contents; a crash here leaves tmp_* debris, cleaned later
        return
    backup = dest.with_name(f"old_{dest.name}")
    if backup.exists():
        shutil.rmtree(backup)
    os.rename(dest, backup)
    os.rename(new, dest)
    shutil.rmtree(backup)
