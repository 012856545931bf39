"""`run_in_sandbox`: run untrusted Python in a throw-away process that cannot reach or hurt its caller.

Layers, each covering what the others miss (all need root: CAP_SYS_ADMIN for the namespaces, CAP_SETUID to drop):
- namespaces: network (no interface is up, so no socket reaches anything), mount (every mount read-only, a fresh
  ``/proc``, a private tmpfs on ``/tmp`` holding the run's directory, which vanishes with the run), pid (the program
  sees only its own processes; when the namespace's init exits the kernel kills all that is left in it) and IPC;
- a uid/gid of its own per run, with no_new_privs: it owns no file, may signal nothing it did not start, gains nothing
  from setuid binaries, and RLIMIT_NPROC (never enforced for root) counts only this run's processes;
- rlimits: cpu seconds, address space, processes, file size, open files, no core files;
- from outside: the wall-clock deadline and the output cap SIGKILL the process group, and before returning a sweep
  kills and waits out every process still running as the run's uid.

Process chain: caller → launcher (this file as a script, root) → init (pid 1 of the new pid namespace, root) → program
(pid 2, the run's uid). The launcher is a fresh interpreter rather than a ``preexec_fn``: no Python code then runs in a
fork of a multi-threaded caller (a Ray actor), and a failed setup step comes back as one line.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import resource
import selectors
import signal
import stat
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

SandboxStatus = Literal["ok", "error", "timeout", "memory", "output_limit", "killed", "sandbox_error"]
# Per-run uid = UID_BASE + launcher pid: distinct for every live run, owned by no file or user of the machine.
UID_BASE = 1_000_000_000
WORKDIR = "/tmp/work"
_NEWNS, _NEWIPC, _NEWPID, _NEWNET = 0x20000, 0x8000000, 0x20000000, 0x40000000
_RDONLY, _NOSUID, _NODEV, _NOEXEC, _REMOUNT, _BIND, _REC, _PRIVATE = 1, 2, 4, 8, 32, 4096, 0x4000, 0x40000
_KEPT_FLAGS = {"nosuid": _NOSUID, "nodev": _NODEV, "noexec": _NOEXEC, "noatime": 1024, "nodiratime": 2048}
_KEPT_FLAGS |= {"relatime": 1 << 21, "strictatime": 1 << 24}
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38


class SandboxUnavailableError(RuntimeError):
    """This process cannot build the sandbox; nothing ever runs unsandboxed instead."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run. ``uid``/``gid`` None: fresh ids per run (`UID_BASE`); a fixed uid must be used by nothing
    else: concurrent runs then share its process limit, and the end-of-run sweep kills all its processes.
    ``python``: the interpreter run as that uid (None: the first of this one, /usr/bin/python3 and
    /usr/local/bin/python3 that other users may execute; an interpreter under /root is not)."""

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
        return problems


@dataclass(frozen=True)
class SandboxResult:
    """``returncode``: the program's exit status (-N: killed by signal N; None: it never ran or was cut off).
    ``stdout``/``stderr``: at most ``max_output_bytes`` each, decoded with replacement. ``uid``: the run's uid."""

    status: SandboxStatus
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    reason: str
    uid: int
    cpu_s: float | None = None


def check_sandbox_available(limits: SandboxLimits) -> None:
    """A trial run; raises `SandboxUnavailableError` (one line saying why) unless the sandbox works here."""
    result = run_in_sandbox("import os\nprint(os.getuid())", limits)
    if result.status != "ok" or result.stdout.strip() != str(result.uid):
        detail = (result.stderr.strip().splitlines() or [result.stdout.strip()])[-1][:300]
        raise SandboxUnavailableError(f"code sandbox trial run failed ({result.status}): {result.reason}; {detail}")


def sandbox_python(limits: SandboxLimits) -> str:
    """The interpreter the program runs under: a real path that a user owning nothing may execute."""
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
        if os.path.isfile(real) and all(
            os.stat("/".join(parts[:end]) or "/").st_mode & stat.S_IXOTH for end in range(1, len(parts) + 1)
        ):
            return real
    raise SandboxUnavailableError(
        f"no Python interpreter that the sandbox uid may execute among {candidates} (the file and every directory "
        "above it need the 'others' x bit); set the sandbox's python to one, e.g. /usr/bin/python3"
    )


def run_in_sandbox(code: str, limits: SandboxLimits, stdin: str = "") -> SandboxResult:
    """Runs ``code`` as ``python -I main.py`` in a fresh sandbox; never raises for anything the code does."""
    if os.geteuid() != 0:
        raise SandboxUnavailableError(
            "code sandbox needs root (CAP_SYS_ADMIN for its namespaces, CAP_SETUID to drop to an unprivileged uid); "
            f"running as uid {os.geteuid()}"
        )
    problems = limits.check()
    if problems:
        raise ValueError("invalid sandbox limits: " + "; ".join(f"{key}: {message}" for key, message in problems))
    python = sandbox_python(limits)
    status_r, status_w = os.pipe()
    start = time.monotonic()
    try:
        launcher, pipe = [sys.executable, "-I", "-S", os.path.abspath(__file__)], subprocess.PIPE
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
    uid = UID_BASE + proc.pid if limits.uid is None else limits.uid
    gid = uid if limits.gid is None else limits.gid
    job = {"code": code, "stdin": stdin, "uid": uid, "gid": gid, "python": python, "limits": asdict(limits)}
    job |= {"parent": os.getpid(), "status_fd": status_w}
    try:
        out, err, cut = _exchange(proc, json.dumps(job).encode(), limits.max_output_bytes, start + limits.wall_s)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # before reaping the launcher, whose pid is the group's id
        proc.wait()
        _sweep(uid)
        reports = _read_reports(status_r)
    stdout, stderr = (data.decode("utf-8", "replace") for data in (out, err))
    status, reason = _classify(reports, cut, proc.returncode, stderr, limits)
    wall_s = time.monotonic() - start
    return SandboxResult(status, reports.get("returncode"), stdout, stderr, wall_s, reason, uid, reports.get("cpu_s"))


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


def _sweep(uid: int, timeout_s: float = 5.0) -> None:
    """SIGKILLs every process running as ``uid`` until none is left (a pid namespace's teardown is asynchronous)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = []
        for name in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{name}/status", "rb") as status:
                    uids = next(line for line in status if line.startswith(b"Uid:")).split()[1:]
            except (OSError, StopIteration):
                continue
            if str(uid).encode() in uids:
                pids.append(int(name))
        if not pids:
            return
        if time.monotonic() + 0.01 >= deadline:  # unkillable (stuck in the kernel): say so rather than hang
            logging.getLogger(__name__).warning("sandbox: processes %s of uid %d outlived the run", pids, uid)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)


def _read_reports(status_r: int) -> dict[str, Any]:
    """The launcher's and init's one-line JSON reports, merged: a setup ``error`` is never hidden by a later line."""
    os.set_blocking(status_r, False)
    data = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(status_r, 65536):
            data += chunk
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


# ---- launcher side: ``python -I -S sandbox.py``, root, session leader; the job arrives on stdin ----


def _report(fd: int, **fields: Any) -> None:
    fields = {key: value[:2000] if isinstance(value, str) else value for key, value in fields.items()}
    os.write(fd, (json.dumps(fields) + "\n").encode())


def _failed(step: str, error: BaseException) -> str:
    return f"{step}: {error if isinstance(error, OSError) else f'{type(error).__name__}: {error}'}"


def _call(function: Any, *args: Any) -> None:
    import ctypes

    if function(*args) != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


def _launcher_main() -> None:
    """Reads the job, enters new namespaces, forks init and waits for it."""
    import ctypes

    job = json.loads(sys.stdin.buffer.read())
    fd, libc, step = job["status_fd"], ctypes.CDLL(None, use_errno=True), "prctl(PDEATHSIG)"
    try:
        _call(libc.prctl, _PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != job["parent"]:  # the caller died before the line above took effect
            os._exit(1)
        step = "unshare(mount, network, pid, ipc namespaces)"
        _call(libc.unshare, _NEWNS | _NEWNET | _NEWPID | _NEWIPC)
        step = "making mounts private"
        _call(libc.mount, b"none", b"/", None, _REC | _PRIVATE, None)
        init = os.fork()
    except Exception as error:
        _report(fd, error=_failed(step, error))
        os._exit(1)
    if init == 0:
        _init_main(libc, job)
    os.waitpid(init, 0)
    os._exit(0)


def _init_main(libc: Any, job: dict[str, Any]) -> None:
    """Pid 1 of the namespace: builds the filesystem view, starts the program as the run's uid, reports its status."""
    fd, uid, gid, step = job["status_fd"], job["uid"], job["gid"], "prctl(PDEATHSIG)"
    try:
        _call(libc.prctl, _PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        with open("/proc/self/mountinfo") as mountinfo:
            mounts = [line.split()[4:6] for line in mountinfo]
        for escaped, options in mounts:  # all read-only, keeping each mount's other flags; /proc is replaced below
            step = f"remounting {escaped} read-only"
            target = escaped.encode().decode("unicode_escape").encode("latin-1")  # mountinfo writes " " as \040
            if target != b"/proc" and not target.startswith(b"/proc/"):
                flags = sum(_KEPT_FLAGS.get(option, 0) for option in options.split(","))
                try:
                    _call(libc.mount, None, target, None, _REMOUNT | _BIND | _RDONLY | flags, None)
                except OSError as error:  # gone, or closed even to root (FUSE without allow_other): not a way out
                    if error.errno not in (errno.ENOENT, errno.EACCES):
                        raise
        step = "mounting /proc and a tmpfs on /tmp"
        _call(libc.mount, b"proc", b"/proc", b"proc", _NOSUID | _NODEV | _NOEXEC, None)
        size = f"size={job['limits']['disk_mb']}m,mode=0755".encode()
        _call(libc.mount, b"tmpfs", b"/tmp", b"tmpfs", _NOSUID | _NODEV, size)
        step = "writing the program"
        os.mkdir(WORKDIR, 0o700)
        os.chown(WORKDIR, uid, gid)
        _write(f"{WORKDIR}/main.py", job["code"], uid, gid)
        _write("/tmp/.stdin", job["stdin"], 0, 0)
        stdin_fd = os.open("/tmp/.stdin", os.O_RDONLY)
        os.unlink("/tmp/.stdin")
        os.set_inheritable(fd, False)
        program = os.fork()
    except Exception as error:
        _report(fd, error=_failed(step, error))
        os._exit(1)
    if program == 0:
        _exec_program(libc, job, stdin_fd)
    os.close(stdin_fd)
    while True:  # as init, it also reaps orphaned grandchildren
        pid, status, usage = os.wait4(-1, 0)
        if pid == program:
            break
    cpu_s = round(usage.ru_utime + usage.ru_stime, 3)
    _report(fd, returncode=os.waitstatus_to_exitcode(status), cpu_s=cpu_s, max_rss_mb=usage.ru_maxrss // 1024)
    os._exit(0)


def _write(path: str, text: str, uid: int, gid: int) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(descriptor, "w", encoding="utf-8", errors="replace") as file:
        file.write(text)
    os.chown(path, uid, gid)


def _exec_program(libc: Any, job: dict[str, Any], stdin_fd: int) -> None:
    limits, uid, gid, step = job["limits"], job["uid"], job["gid"], "setting resource limits"
    try:
        os.dup2(stdin_fd, 0)
        os.close(stdin_fd)
        os.chdir(WORKDIR)
        os.umask(0o077)
        megabyte = 1 << 20
        resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))  # SIGXCPU, then SIGKILL
        resource.setrlimit(resource.RLIMIT_AS, (limits["memory_mb"] * megabyte,) * 2)
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"],) * 2)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits["max_file_mb"] * megabyte,) * 2)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits["max_open_files"],) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        step = f"dropping to uid {uid} / gid {gid}"
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        _call(libc.prctl, _PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        step = f"running {job['python']} as uid {uid}"
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": WORKDIR, "TMPDIR": WORKDIR}
        env |= {"USER": "sandbox", "LOGNAME": "sandbox"}  # getpass.getuser() without a passwd entry
        os.execve(job["python"], [job["python"], "-I", "main.py"], env)
    except Exception as error:
        _report(job["status_fd"], error=_failed(step, error))
    os._exit(127)


if __name__ == "__main__":
    _launcher_main()
