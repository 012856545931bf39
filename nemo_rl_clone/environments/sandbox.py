"""`run_in_sandbox`: run untrusted Python in a throw-away process that cannot reach or hurt its caller.

Layers, each covering what the others miss:
- namespaces: network (no interface is up, so no socket reaches anything), mount (every mount read-only, a fresh
  ``/proc``, a private tmpfs on ``/tmp`` holding the run's directory, which vanishes with the run), pid (the program
  sees only its own processes; when the namespace's init exits the kernel kills all that is left in it) and IPC;
- an unprivileged uid with no_new_privs: it gains nothing from setuid binaries, and RLIMIT_NPROC counts its processes;
- rlimits: cpu seconds, address space, processes, file size, open files, no core files;
- from outside: the wall-clock deadline and the output cap SIGKILL the process group, and before returning a sweep
  kills and waits out every process still running in the run's pid namespace (root path: as the run's uid).

Paths (`SandboxMode`; ``auto`` picks the first that works here, names it in the log once, and refuses in one line,
`SandboxUnavailableError`, when none does; nothing ever runs unsandboxed):
- ``root`` (CAP_SYS_ADMIN, CAP_SETUID): the program runs as a uid of its own per run, owning no file;
- ``userns`` (any user, where unprivileged user namespaces work): a user namespace maps only the caller's uid, so the
  program keeps the caller's file permissions (read-only; the caller's home is hidden) and shares its uid with init;
- ``bwrap`` (bubblewrap 0.7+ on PATH, unprivileged: a setuid one refuses ``--size``): the same, built by bwrap.

Process chain: caller → launcher (`sandbox_launcher` as a script) → init (pid 1 of the new pid namespace) → program
(pid 2). The launcher is a fresh interpreter rather than a ``preexec_fn``: no Python code then runs in a fork of a
multi-threaded caller (a Ray actor), and a failed setup step comes back as one line.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import pwd
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

from nemo_rl_clone.environments.sandbox_launcher import INNER_ID as INNER_ID
from nemo_rl_clone.environments.sandbox_launcher import WORKDIR as WORKDIR

SandboxStatus = Literal["ok", "error", "timeout", "memory", "output_limit", "killed", "sandbox_error"]
SandboxMode = Literal["auto", "root", "userns", "bwrap"]
# Per-run uid = UID_BASE + launcher pid: distinct for every live run, owned by no file or user of the machine.
UID_BASE = 1_000_000_000
LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_launcher.py")
_logged_modes: set[str] = set()


class SandboxUnavailableError(RuntimeError):
    """This process cannot build the sandbox; nothing ever runs unsandboxed instead."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run. ``uid``/``gid`` (root path) None: fresh ids per run (`UID_BASE`); a fixed uid must be used
    by nothing else: concurrent runs then share its process limit, and the end-of-run sweep kills all its processes.
    ``python``: the interpreter the program runs under (None: the first of this one, /usr/bin/python3 and
    /usr/local/bin/python3 that the program's uid may execute; in the root path an interpreter under /root is not).
    ``mode``: the path (`SandboxMode`); ``auto``: root if this process is root, else ``userns``, else ``bwrap``."""

    wall_s: float = 10.0
    cpu_s: int = 5
    memory_mb: int = 512
    max_processes: int = 8
    max_output_bytes: int = 65536
    max_file_mb: int = 16
    disk_mb: int = 64
    max_open_files: int = 64
    uid: int | None = None
    gid: int | None = None
    python: str | None = None
    mode: SandboxMode = "auto"

    def check(self) -> list[tuple[str, str]]:
        minimum = {"cpu_s": 1, "memory_mb": 64, "max_processes": 1, "max_output_bytes": 1, "max_file_mb": 1}
        minimum |= {"disk_mb": 1, "max_open_files": 16}
        problems = [(key, f"must be >= {low}, got {getattr(self, key)}") for key, low in minimum.items()]
        problems = [problem for problem in problems if getattr(self, problem[0]) < minimum[problem[0]]]
        if self.wall_s <= 0:
            problems.append(("wall_s", f"must be > 0, got {self.wall_s}"))
        for key in ("uid", "gid"):
            value = getattr(self, key)
            if value is not None and not 0 < value < 2**32 - 1:
                problems.append((key, f"must be an unprivileged id in [1, 2**32 - 2] or null, got {value}"))
        if self.mode not in get_args(SandboxMode):
            problems.append(("mode", f"choose from {list(get_args(SandboxMode))}, got {self.mode!r}"))
        return problems


@dataclass(frozen=True)
class SandboxResult:
    """``returncode``: the program's exit status (-N: killed by signal N; None: it never ran or was cut off).
    ``stdout``/``stderr``: at most ``max_output_bytes`` each, decoded with replacement. ``uid``: the program's uid
    as it sees it (root path: the run's own; userns/bwrap: `INNER_ID`, the caller's uid). ``mode``: the path taken."""

    status: SandboxStatus
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    reason: str
    uid: int
    cpu_s: float | None = None
    mode: SandboxMode = "root"


def check_sandbox_available(limits: SandboxLimits) -> None:
    """A trial run; raises `SandboxUnavailableError` (one line saying why) unless the sandbox works here."""
    result = run_in_sandbox("import os\nprint(os.getuid())", limits)
    if result.status != "ok" or result.stdout.strip() != str(result.uid):
        detail = (result.stderr.strip().splitlines() or [result.stdout.strip()])[-1][:300]
        raise SandboxUnavailableError(
            f"code sandbox trial run failed ({result.mode} path, {result.status}): {result.reason}; {detail}"
        )


def sandbox_python(limits: SandboxLimits, mode: SandboxMode = "root") -> str:
    """The interpreter the program runs under: a real path that the program's uid may execute (root path: a user
    owning nothing, so the file and every directory above it need the 'others' x bit)."""
    own = [
        getattr(sys, "_base_executable", sys.executable),
        sys.executable,
        "/usr/bin/python3",
        "/usr/local/bin/python3",
    ]
    candidates = [limits.python] if limits.python else own
    for candidate in candidates:
        real = os.path.realpath(candidate)
        parts = real.split("/")
        if mode != "root":
            if os.path.isfile(real) and os.access(real, os.X_OK):
                return real
        elif os.path.isfile(real) and all(
            os.stat("/".join(parts[:end]) or "/").st_mode & stat.S_IXOTH for end in range(1, len(parts) + 1)
        ):
            return real
    raise SandboxUnavailableError(
        f"no Python interpreter that the sandbox uid may execute among {candidates} (root path: the file and every "
        "directory above it need the 'others' x bit); set the sandbox's python to one, e.g. /usr/bin/python3"
    )


def _resolve_mode(limits: SandboxLimits) -> SandboxMode:
    """The path this run takes; raises `SandboxUnavailableError` (one line) where the asked-for one cannot work."""
    euid, mode = os.geteuid(), limits.mode
    if mode == "root" and euid != 0:
        raise SandboxUnavailableError(
            "code sandbox mode 'root' needs root (CAP_SYS_ADMIN for its namespaces, CAP_SETUID to drop to an "
            f"unprivileged uid); running as uid {euid}; mode 'auto' takes user namespaces or bwrap instead"
        )
    if mode in ("userns", "bwrap") and euid == 0:  # the program would keep root's file permissions
        raise SandboxUnavailableError(f"code sandbox mode {mode!r} is for users other than root; use 'root' or 'auto'")
    if mode == "bwrap" and shutil.which("bwrap") is None:
        raise SandboxUnavailableError(
            "code sandbox mode 'bwrap': bwrap is not on PATH (Debian: apt install bubblewrap)"
        )
    if mode == "auto":
        if euid == 0:
            mode = "root"
        elif (userns_problem := _userns_problem()) is None:
            mode = "userns"
        elif shutil.which("bwrap") is not None:
            mode = "bwrap"
        else:
            raise SandboxUnavailableError(
                f"no code sandbox here: not root (uid {euid}), user namespaces do not work ({userns_problem}) and "
                "bwrap is not on PATH; nothing runs unsandboxed"
            )
    if mode not in _logged_modes:
        _logged_modes.add(mode)
        described = {"root": "root: namespaces and a uid of its own per run", "bwrap": "bubblewrap"}
        described["userns"] = f"an unprivileged user namespace (uid {euid} seen as {INNER_ID})"
        logging.getLogger(__name__).info("code sandbox path: %s", described[mode])
    return mode


@functools.cache
def _userns_problem() -> str | None:
    """None if a trial run in a user namespace works here (once per process), else why not."""
    try:
        result = _run("import os\nprint(os.getuid())", SandboxLimits(), "", "userns")
    except SandboxUnavailableError as error:  # no interpreter
        return str(error)
    if result.status == "ok" and result.stdout.strip() == str(INNER_ID):
        return None
    return f"{result.status}: {result.reason}"[:300]


def _hidden_paths(python: str) -> list[str]:
    """The caller's directories that the userns/bwrap program, running as the caller's uid, must not read."""
    uid, found = os.getuid(), []
    with contextlib.suppress(KeyError):
        found.append(pwd.getpwuid(uid).pw_dir)
    found += [os.environ.get("HOME", ""), f"/run/user/{uid}"]
    hidden: list[str] = []
    for path in map(os.path.realpath, filter(None, found)):
        # Not / or a directory holding the interpreter (a venv under the home directory keeps it visible).
        inside = python == path or python.startswith(path.rstrip("/") + "/")
        if path != "/" and os.path.isdir(path) and not inside and path not in hidden:
            hidden.append(path)
    return hidden


def run_in_sandbox(code: str, limits: SandboxLimits, stdin: str = "") -> SandboxResult:
    """Runs ``code`` as ``python -I main.py`` in a fresh sandbox; never raises for anything the code does."""
    problems = limits.check()
    if problems:
        raise ValueError("invalid sandbox limits: " + "; ".join(f"{key}: {message}" for key, message in problems))
    return _run(code, limits, stdin, _resolve_mode(limits))


def _run(code: str, limits: SandboxLimits, stdin: str, mode: SandboxMode) -> SandboxResult:
    python = sandbox_python(limits, mode)
    status_r, status_w = os.pipe()
    start = time.monotonic()
    try:
        launcher, pipe = [sys.executable, "-I", "-S", LAUNCHER], subprocess.PIPE
        proc = subprocess.Popen(
            launcher,
            stdin=pipe,
            stdout=pipe,
            stderr=pipe,
            pass_fds=(status_w,),
            start_new_session=True,
            env={},
            cwd="/",
        )
    except BaseException:
        os.close(status_r)
        raise
    finally:
        os.close(status_w)
    if mode == "root":
        uid = UID_BASE + proc.pid if limits.uid is None else limits.uid
        gid = uid if limits.gid is None else limits.gid
    else:
        uid = gid = INNER_ID
    job = {"code": code, "stdin": stdin, "uid": uid, "gid": gid, "python": python, "limits": asdict(limits)}
    job |= {"parent": os.getpid(), "status_fd": status_w, "mode": mode}
    job |= {"hide": _hidden_paths(python) if mode != "root" else []}
    status_data = bytearray()
    cut: str | None = "interrupted"  # until _exchange returns
    try:
        out, err, cut = _exchange(proc, json.dumps(job).encode(), limits.max_output_bytes, start + limits.wall_s)
    finally:
        if mode != "root" and cut is not None and proc.poll() is None:
            # Kill init, not the launcher: the launcher reaps it once the kernel has emptied the namespace, so no
            # zombie of the caller's uid is left waiting for the machine's init.
            init = _read_reports(status_r, status_data, close=False).get("init")
            with contextlib.suppress(ProcessLookupError, TypeError, subprocess.TimeoutExpired):
                os.kill(init, signal.SIGKILL)  # type: ignore[arg-type]
                proc.wait(5)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # before reaping the launcher, whose pid is the group's id
        proc.wait()
        reports = _read_reports(status_r, status_data)
        if mode == "root":
            _sweep(lambda pid: _uid_of(pid) == uid, f"uid {uid}")
        elif "pidns" in reports:  # the caller's own uid: only the namespace tells the run's processes apart
            _sweep(lambda pid: _pidns_of(pid) == reports["pidns"], reports["pidns"])
    stdout, stderr = (data.decode("utf-8", "replace") for data in (out, err))
    status, reason = _classify(reports, cut, proc.returncode, stderr, limits)
    wall_s = time.monotonic() - start
    returncode, cpu_s = reports.get("returncode"), reports.get("cpu_s")
    if mode == "bwrap" and cut is not None:  # bwrap reports the SIGKILL of a cut-off run; the others report nothing
        returncode = None
    return SandboxResult(status, returncode, stdout, stderr, wall_s, reason, uid, cpu_s, mode)


def _exchange(
    proc: subprocess.Popen[bytes], job: bytes, cap: int, deadline: float
) -> tuple[bytearray, bytearray, str | None]:
    """Writes the job, reads both outputs (at most ``cap`` bytes each); returns them and why they were cut short.

    Both pipes reach EOF only once the launcher has exited, which it does after the whole namespace is gone."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    out, err = bytearray(), bytearray()
    buffers = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    stdin_fd, written = proc.stdin.fileno(), 0
    os.set_blocking(stdin_fd, False)
    with selectors.DefaultSelector() as selector:
        selector.register(stdin_fd, selectors.EVENT_WRITE)
        for fd in buffers:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return out, err, "timeout"
            for key, _ in selector.select(remaining):
                if key.fd == stdin_fd:
                    try:
                        written += os.write(stdin_fd, job[written : written + 65536])
                    except BrokenPipeError:  # the launcher died: its report or stderr says why
                        written = len(job)
                    if written == len(job):
                        selector.unregister(stdin_fd)
                        proc.stdin.close()
                    continue
                chunk, buffer = os.read(key.fd, 65536), buffers[key.fd]
                if not chunk:
                    selector.unregister(key.fd)
                elif len(buffer) + len(chunk) > cap:
                    buffer += chunk[: cap - len(buffer)]
                    return out, err, "output_limit"
                else:
                    buffer += chunk
    return out, err, None


def _uid_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            return int(next(line for line in status if line.startswith(b"Uid:")).split()[1])
    except (OSError, StopIteration, ValueError):
        return None


def _pidns_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            if stat_file.read().rsplit(b")", 1)[1].split()[0] == b"Z":  # a zombie holds nothing; its parent reaps it
                return None
        return os.readlink(f"/proc/{pid}/ns/pid")
    except (OSError, IndexError):
        return None


def _sweep(belongs: Any, what: str, timeout_s: float = 5.0) -> None:
    """SIGKILLs every process that ``belongs`` to the run until none is left (a pid namespace's teardown is
    asynchronous)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if belongs(pid)]
        if not pids:
            return
        if time.monotonic() + 0.01 >= deadline:  # unkillable (stuck in the kernel): say so rather than hang
            logging.getLogger(__name__).warning("sandbox: processes %s of %s outlived the run", pids, what)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)


def _read_reports(status_r: int, data: bytearray, close: bool = True) -> dict[str, Any]:
    """The launcher's and init's one-line JSON reports so far (appended to ``data``), merged: a setup ``error`` is
    never hidden by a later line."""
    os.set_blocking(status_r, False)
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(status_r, 65536):
            data += chunk
    if close:
        os.close(status_r)
    reports: dict[str, Any] = {}
    for line in data.splitlines():
        with contextlib.suppress(ValueError):
            reports = json.loads(line) | reports
    return reports


def _classify(
    reports: dict[str, Any], cut: str | None, launcher_rc: int | None, stderr: str, limits: SandboxLimits
) -> tuple[SandboxStatus, str]:
    rc, cpu_s = reports.get("returncode"), reports.get("cpu_s")
    last_line = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")[:300]
    if "error" in reports:
        return "sandbox_error", f"sandbox setup failed: {reports['error']}"
    if cut == "timeout":
        return "timeout", f"wall-clock limit {limits.wall_s} s exceeded"
    if cut == "output_limit":
        return "output_limit", f"output over {limits.max_output_bytes} bytes (kept the first {limits.max_output_bytes})"
    if rc is None:
        return "sandbox_error", f"the launcher exited with {launcher_rc} without the program's status: {last_line}"
    if rc == 0:
        return "ok", "exited with status 0"
    if last_line.startswith("MemoryError"):
        return "memory", f"MemoryError under the {limits.memory_mb} MB address-space limit"
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.valid_signals() else f"signal {-rc}"
        if -rc == signal.SIGXCPU or (-rc == signal.SIGKILL and cpu_s is not None and cpu_s >= limits.cpu_s):
            return "timeout", f"killed by {name}: cpu limit {limits.cpu_s} s"
        return "killed", f"killed by {name}"
    return "error", f"exit status {rc}: {last_line}" if last_line else f"exit status {rc}"
