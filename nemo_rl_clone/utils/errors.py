"""Errors in what the user gave (config values, model names, data files) and the one place that reports them.

Data, model and config code raise a :class:`UserInputError` (or a subclass) whose message names the culprit: a config
key, a file, a row. The entry points run under :func:`reporting_user_errors`, which prints such an error as
``error: ...`` on stderr and exits with code 2, also when it was raised inside a Ray actor; any other exception is a
bug and keeps its traceback. Scripts that run none of our entry points (NeMo-RL's, or a user's own, which call
``setup()`` at their top level) get the same lines from :func:`report_uncaught_user_errors`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from types import TracebackType

USER_INPUT_ERROR_EXIT_CODE = 2


class UserInputError(Exception):
    """Bad user input: each of ``problems`` is one line naming the config key, file or row at fault."""

    def __init__(self, *problems: str) -> None:
        super().__init__(*problems)
        self.problems: list[str] = [p for problem in problems for p in str(problem).splitlines() if p.strip()] or [
            "invalid input"
        ]

    def __str__(self) -> str:
        return "; ".join(self.problems)


def find_user_input_error(error: BaseException) -> UserInputError | None:
    """The :class:`UserInputError` behind ``error``, looking through ``raise ... from`` chains and Ray's wrappers.

    Ray re-raises an actor's exception as ``RayTaskError`` (the original is its ``cause``); an exception in an
    actor's constructor reaches the driver only as text (``ActorDiedError``), whose last traceback line
    (``ClassName: message``) is matched against the user-input error classes this process has imported (the
    driver imports every component whose checks it runs, so their error classes are known).
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        cause = getattr(current, "cause", None)  # ray.exceptions.RayTaskError
        if isinstance(cause, UserInputError):
            return cause
        if isinstance(current, UserInputError):
            return current
        from_text = _user_input_error_from_text(getattr(current, "error_msg", None))  # ray.exceptions.RayActorError
        if from_text is not None:
            return from_text
        current = current.__cause__ or current.__context__
    return None


def _user_input_error_from_text(text: object) -> UserInputError | None:
    if not isinstance(text, str) or not text.strip():
        return None
    last = text.strip().splitlines()[-1]
    name, sep, message = last.partition(": ")
    if sep and name.rpartition(".")[2] in _user_input_error_class_names():
        return UserInputError(message)
    return None


def _user_input_error_class_names() -> set[str]:
    names, pending = set(), [UserInputError]
    while pending:
        cls = pending.pop()
        names.add(cls.__name__)
        pending.extend(cls.__subclasses__())
    return names


@contextlib.contextmanager
def reporting_user_errors() -> Iterator[None]:
    """Run an entry point's work: a user-input error becomes ``error: ...`` lines on stderr and exit code 2.

    While the block runs, whatever else reaches stderr (library warnings, Ray's log lines, workers' streamed output,
    subprocesses) goes to stdout instead, so that stderr carries only the verdicts (these, and `report_fault`'s). A
    real bug (any other exception) propagates with its traceback, printed to the real stderr once the block is left.
    """
    global _real_stderr_fd
    sys.stdout.flush()
    sys.stderr.flush()
    real_stderr = os.dup(2)
    os.dup2(1, 2)
    _real_stderr_fd = real_stderr
    try:
        yield
    except Exception as error:
        found = find_user_input_error(error)
        if found is None:
            raise
        _restore_stderr(real_stderr)
        real_stderr = -1
        for problem in found.problems:
            print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(USER_INPUT_ERROR_EXIT_CODE) from None
    finally:
        if real_stderr >= 0:
            _restore_stderr(real_stderr)


def _restore_stderr(saved_fd: int) -> None:
    global _real_stderr_fd
    sys.stdout.flush()
    sys.stderr.flush()
    _real_stderr_fd = None
    os.dup2(saved_fd, 2)
    os.close(saved_fd)


_real_stderr_fd: int | None = None  # the process's stderr while `reporting_user_errors` sends fd 2 to stdout


def report_fault(line: str) -> None:
    """One fault verdict (a stop, a failed save, a checkpoint set aside) on the process's real stderr, where a Slurm
    ``.err`` file and log collectors look; progress and metrics stay on stdout. Written straight to a file
    descriptor, no Python stream touched: it may run in a signal handler that interrupted a write to one, or while
    rich's progress bar holds ``sys.stdout``."""
    data = (line + "\n").encode()
    if _real_stderr_fd is not None:
        os.write(_real_stderr_fd, data)
        return
    try:
        os.write(sys.stderr.fileno(), data)
    except (AttributeError, OSError, ValueError):  # a stderr without a descriptor (a captured or replaced stream)
        print(line, file=sys.stderr, flush=True)


_ExceptHook = Callable[[type[BaseException], BaseException, TracebackType | None], object]


def report_uncaught_user_errors(*also: type[Exception]) -> None:
    """From now on this process prints an uncaught user-input error, or one of the error classes ``also`` (each
    with a ``problems`` list: the config validator's), as its ``error: ...`` lines instead of a traceback (the
    process then exits with status 1, as on any uncaught error). Installed once, by the code paths that NeMo-RL-form
    scripts call first (their config validation, a refused import); any other error goes to the hook that was there
    before."""
    _ALSO_REPORTED.update(also)
    previous = sys.excepthook
    if getattr(previous, "reports_user_errors", False):
        return

    def hook(kind: type[BaseException], error: BaseException, traceback: TracebackType | None) -> None:
        found = error if isinstance(error, tuple(_ALSO_REPORTED)) else find_user_input_error(error)
        if found is None:
            previous(kind, error, traceback)
            return
        for problem in found.problems:  # type: ignore[attr-defined]
            print(f"error: {problem}", file=sys.stderr)

    hook.reports_user_errors = True  # type: ignore[attr-defined]
    sys.excepthook = hook


_ALSO_REPORTED: set[type[Exception]] = set()
