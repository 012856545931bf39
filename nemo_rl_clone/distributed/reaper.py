"""A watchdog process that removes everything a run started once its driver is gone, however it went.

The driver cannot clean up after SIGKILL, and Ray's own reaper only SIGTERMs the driver's process group: Ray's
dashboard and runtime-env agents and the workers (each in a process group of its own) can outlive it. So
`start_reaper()` (called by `init_ray` before Ray starts) spawns this module as a child that:

- watches the driver through a pipe: the driver's end closes when the driver exits for any reason (EOF here);
- records the driver's process tree every ``_POLL_S`` (pid + creation time, so a reused pid is never killed), because
  processes whose parent died are re-parented to init and no longer show up as descendants;
- on EOF, SIGKILLs every recorded process still alive and their current descendants, removes the temp paths the
  driver registered (`register_temp_path`) and the checkpoint debris (``tmp_*``) of registered checkpoint dirs.

It ignores SIGINT and SIGTERM: a Ctrl-C in the terminal or a scheduler's SIGTERM to the whole group is the driver's to
handle, and the reaper must still be there to clean up after it.

Messages on the pipe are lines ``path <p>`` and ``ckpt <dir>``.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

import psutil

_POLL_S = 0.5
_reaper: subprocess.Popen | None = None


def start_reaper() -> None:
    """Start the watchdog of this process (once per process; later calls do nothing)."""
    global _reaper
    if _reaper is not None and _reaper.poll() is None:
        return
    _reaper = subprocess.Popen(
        [sys.executable, "-m", "nemo_rl_clone.distributed.reaper", str(os.getpid())],
        stdin=subprocess.PIPE,
        text=True,
        close_fds=True,
    )


def _send(line: str) -> None:
    if _reaper is None or _reaper.stdin is None:
        return
    try:
        _reaper.stdin.write(line + "\n")
        _reaper.stdin.flush()
    except (BrokenPipeError, ValueError):  # the reaper is gone: nothing more to register
        pass


def register_temp_path(path: str | os.PathLike) -> None:
    """Remove ``path`` (file or folder) when the driver is gone, unless the run removed it already."""
    _send(f"path {os.fspath(path)}")


def register_checkpoint_dir(path: str | os.PathLike) -> None:
    """Remove interrupted-save debris (``tmp_*``) of this checkpoint dir when the driver is gone."""
    _send(f"ckpt {os.fspath(path)}")


# ---------------------------------------------------------------------------------------------------------------
# The reaper process
# ---------------------------------------------------------------------------------------------------------------


def _record(driver: psutil.Process, known: dict[int, float]) -> None:
    try:
        for child in driver.children(recursive=True):
            known.setdefault(child.pid, child.create_time())
    except psutil.Error:  # the driver or a child vanished mid-walk; the next poll catches up
        pass


def _kill_recorded(known: dict[int, float]) -> None:
    me = os.getpid()
    victims: dict[int, psutil.Process] = {}
    for pid, created in known.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() != created:
                continue  # the pid was reused by an unrelated process
            victims[pid] = proc
            for child in proc.children(recursive=True):
                victims[child.pid] = child
        except psutil.Error:
            continue
    victims.pop(me, None)
    for proc in victims.values():
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(list(victims.values()), timeout=5)


def _remove_paths(paths: set[str], checkpoint_dirs: set[str]) -> None:
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)
        parent = Path(path).parent
        for sibling in parent.iterdir() if parent.is_dir() else ():
            if sibling.is_symlink() and os.path.realpath(sibling) == os.path.realpath(path):
                sibling.unlink()  # e.g. Ray's session_latest, pointing at the session dir just removed
    for directory in checkpoint_dirs:
        from nemo_rl_clone.utils.checkpoint import remove_save_debris

        remove_save_debris(Path(directory))


def _watch(driver_pid: int, stream: IO[str]) -> None:
    known: dict[int, float] = {}
    paths: set[str] = set()
    checkpoint_dirs: set[str] = set()
    try:
        driver = psutil.Process(driver_pid)
    except psutil.NoSuchProcess:
        return
    fd = stream.fileno()
    buffer = b""
    while True:
        _record(driver, known)
        try:
            readable, _, _ = select.select([fd], [], [], _POLL_S)
        except InterruptedError:
            continue
        if not readable:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break  # EOF: the driver is gone
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for raw in lines:
            kind, _, value = raw.decode().partition(" ")
            (paths if kind == "path" else checkpoint_dirs).add(value)
    _kill_recorded(known)
    _remove_paths(paths, checkpoint_dirs)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _watch(int(sys.argv[1]), sys.stdin)
