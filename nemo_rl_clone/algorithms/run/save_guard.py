"""A checkpoint save that a full disk cannot turn into a traceback (``checkpointing.on_save_failure``).

Before a save: the free space of ``checkpoint_dir`` is compared with the size of the last checkpoint (for the first
one, an estimate from the parameter count), and a save that cannot fit is not started. A save that fails mid-way
with a storage error (ENOSPC, EDQUOT, EIO, EROFS, EFBIG) loses only its ``tmp_step_N``. Either way one line names the
directory and the reason, then ``stop`` ends the run with `SAVE_FAILED_EXIT_CODE` (the previous checkpoint intact)
and ``continue`` trains on without that checkpoint. Any other failure is not a disk problem and propagates.

Workers write the files, so their error often reaches the driver as text (torch's zip writer says only
"unexpected pos 704 vs 598" on a full disk): when no ``OSError`` is found in the error's chain, a small probe write
into the directory, made before the debris is removed, tells whether the storage is what failed and how.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from nemo_rl_clone.utils.checkpoint import CheckpointManager
from nemo_rl_clone.utils.checkpoint_manifest import checkpoint_bytes, verify_checkpoint
from nemo_rl_clone.utils.errors import report_fault

SAVE_FAILED_EXIT_CODE = 74  # sysexits.h's EX_IOERR
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG})
_PROBE_BYTES = 4096  # one block: a disk that cannot take this is full
# Fp32 weights, and Adam's two fp32 moments when the optimizer is saved: what a first checkpoint is estimated at.
_WEIGHT_BYTES, _OPTIMIZER_BYTES = 4, 8

T = TypeVar("T")


class SaveFailed(Exception):
    """A checkpoint was not written; ``str()`` is one line naming the directory and why."""


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")


def estimated_bytes(checkpointer: CheckpointManager, run_config: Any) -> tuple[int, str]:
    """``(bytes, where the number comes from)`` a new checkpoint is expected to take."""
    latest = checkpointer.get_latest_checkpoint_path()
    if latest is not None:
        return checkpoint_bytes(latest), f"the size of {latest.name}"
    policy = run_config.policy
    if getattr(getattr(getattr(policy, "dtensor_cfg", None), "lora_cfg", None), "enabled", False):
        return 0, "a LoRA checkpoint holds the adapters only"  # a fraction of the model: no useful estimate
    from nemo_rl_clone.models.huggingface import resolve_model_path
    from nemo_rl_clone.models.memory_estimate import ModelShape

    overrides = getattr(policy, "hf_config_overrides", None)
    try:
        params = ModelShape.of(resolve_model_path(policy.model_name), overrides).num_parameters
    except Exception as e:  # an estimate that cannot be made never blocks a save; a real failure still names itself
        return 0, f"no estimate ({type(e).__name__})"
    per_param = _WEIGHT_BYTES + (_OPTIMIZER_BYTES if run_config.checkpointing.save_optimizer else 0)
    return params * per_param, f"estimated: {params / 1e6:.1f}M parameters x {per_param} bytes"


def room_problem(directory: Path, needed: int, source: str) -> str | None:
    """One line when ``directory`` has less free space than ``needed`` bytes; None when the save fits."""
    free = shutil.disk_usage(directory).free
    if free >= needed:
        return None
    return f"{directory} has {_size(free)} free, a checkpoint needs about {_size(needed)} ({source})"


def storage_error(error: BaseException, directory: Path) -> str | None:
    """The storage failure behind ``error`` as ``"[Errno 28] No space left on device"``; None when ``error`` is not
    a storage failure (then it is a bug or a worker death, and is handled elsewhere)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in STORAGE_ERRNOS:
            return f"[Errno {current.errno}] {os.strerror(current.errno)}"
        cause = getattr(current, "cause", None)  # ray.exceptions.RayTaskError keeps the worker's exception here
        current = cause if isinstance(cause, BaseException) else (current.__cause__ or current.__context__)
    # Writers report a full disk in their own words (torch's zip writer: a RuntimeError; DCP: a CheckpointException
    # around it); a dead worker or an error that is a bug (Ray's wrapper is an instance of the worker's exception
    # class) is not the disk's fault, even in a full directory.
    if isinstance(error, _BUGS) or _is_worker_death(error):
        return None
    return _probe(directory)


_BUGS = (ArithmeticError, LookupError, TypeError, AttributeError, NameError, AssertionError, ValueError)


def _is_worker_death(error: BaseException) -> bool:
    import ray

    return isinstance(error, ray.exceptions.RayActorError)


def _probe(directory: Path) -> str | None:
    probe = directory / f".space_probe_{os.getpid()}"
    try:
        with probe.open("wb") as out:
            out.write(b"\0" * _PROBE_BYTES)
            out.flush()
            os.fsync(out.fileno())
    except OSError as e:
        if e.errno in STORAGE_ERRNOS:
            return f"[Errno {e.errno}] {os.strerror(e.errno)}"
        return None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return None


def guarded_save(
    checkpointer: CheckpointManager, step: int, run_config: Any, write: Callable[[], T], on_failure: str
) -> T | None:
    """``write()`` (a whole checkpoint save of ``step``) unless the disk cannot hold it. Returns its result, or None
    when the save was skipped or failed and ``on_failure`` is ``"continue"``; raises `SaveFailed` for ``"stop"``."""
    directory = checkpointer.checkpoint_dir
    directory.mkdir(parents=True, exist_ok=True)
    needed, source = estimated_bytes(checkpointer, run_config)
    problem = room_problem(directory, needed, source)
    if problem is None:
        try:
            return write()
        except Exception as error:
            reason = storage_error(error, directory)
            if reason is None:
                raise
        # The failed writer's frames (held by the traceback) may keep a half-written file open, and a removed file
        # frees its space only once closed: let them go first.
        gc.collect()
        _remove_debris(directory, step)
        problem = f"writing to {directory} failed: {reason}"
    kept = _describe_kept(checkpointer)
    line = f"checkpoint of step {step} not saved: {problem}; {kept}"
    if on_failure == "continue":
        report_fault(f"{line}; training on without it (checkpointing.on_save_failure=continue)")
        return None
    raise SaveFailed(line)


def _describe_kept(checkpointer: CheckpointManager) -> str:
    latest = checkpointer.get_latest_checkpoint_path()
    if latest is None:
        return "no complete checkpoint yet"
    try:
        problem = verify_checkpoint(latest)
    except FileNotFoundError:
        return f"last complete checkpoint: {latest} (written before manifests, unverified)"
    return f"last complete checkpoint: {latest} ({'verified' if problem is None else 'fails verification: ' + problem})"


def _remove_debris(directory: Path, step: int) -> None:
    tmp = directory / f"tmp_step_{step}"
    if tmp.exists():
        shutil.rmtree(tmp, ignore_errors=True)
