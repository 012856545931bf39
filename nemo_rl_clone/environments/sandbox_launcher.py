"""The launcher side of `environments.sandbox`: run as ``python -I -S sandbox_launcher.py``; the job arrives on stdin.

Standard library only, and no imports from this package: the launcher runs with ``-I`` (the script's directory is
not on ``sys.path``) and, in the user-namespace path, as whatever user called `run_in_sandbox`.

Paths (the job's ``mode``):
- ``root``: unshare mount/network/pid/IPC namespaces as root; the program drops to a per-run uid;
- ``userns``: one ``unshare`` also creates a user namespace, whose only mapped id is the caller's uid/gid (seen inside
  as `INNER_ID`); the namespace gives the launcher and init the capabilities they need to mount, and the program loses
  them at ``execve`` (its uid is not 0 there). No other id exists inside, so the program shares its uid with init:
  it runs in a session of its own so that ``killpg`` cannot reach the launcher, and init (pid 1) is immune to
  signals from inside its namespace;
- ``bwrap``: the launcher sets the rlimits and execs bubblewrap with the equivalent options.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import signal
import sys
from typing import Any

WORKDIR = "/tmp/work"
INNER_ID = 1000  # the caller's uid and gid as the program sees them in the userns and bwrap paths
_NEWNS, _NEWIPC, _NEWUSER, _NEWPID, _NEWNET = 0x20000, 0x8000000, 0x10000000, 0x20000000, 0x40000000
_RDONLY, _NOSUID, _NODEV, _NOEXEC, _REMOUNT, _BIND, _REC, _PRIVATE = 1, 2, 4, 8, 32, 4096, 0x4000, 0x40000
_KEPT_FLAGS = {"nosuid": _NOSUID, "nodev": _NODEV, "noexec": _NOEXEC, "noatime": 1024, "nodiratime": 2048}
_KEPT_FLAGS |= {"relatime": 1 << 21, "strictatime": 1 << 24}
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER, _PR_SET_NO_NEW_PRIVS = 1, 36, 38
# The launcher and init run as the program's uid in the userns path, and RLIMIT_NPROC counts them too.
USERNS_EXTRA_PROCESSES = 2
BWRAP_EXTRA_PROCESSES = 1  # its pid 1 (bwrap outside is counted where the caller is)
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": WORKDIR, "TMPDIR": WORKDIR}
ENV |= {"USER": "sandbox", "LOGNAME": "sandbox"}  # getpass.getuser() without a passwd entry


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


def _die_with_parent(libc: Any, parent: int) -> None:
    _call(libc.prctl, _PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)


def _launcher_main() -> None:
    """Reads the job, enters new namespaces, forks init and waits for it."""
    import ctypes

    job = json.loads(sys.stdin.buffer.read())
    fd, libc, step = job["status_fd"], ctypes.CDLL(None, use_errno=True), "prctl(PDEATHSIG)"
    try:
        _die_with_parent(libc, job["parent"])
        if job["mode"] == "bwrap":
            _bwrap_main(libc, job)
        if job["mode"] == "userns":
            outer_uid, outer_gid = os.getuid(), os.getgid()  # unmapped (65534) once unshared
            step = "unshare(user, mount, network, pid, ipc namespaces)"
            _call(libc.unshare, _NEWUSER | _NEWNS | _NEWNET | _NEWPID | _NEWIPC)
            step = "writing the user namespace's id maps"
            maps = {"setgroups": "deny", "uid_map": f"{INNER_ID} {outer_uid} 1", "gid_map": f"{INNER_ID} {outer_gid} 1"}
            for name, text in maps.items():
                with open(f"/proc/self/{name}", "w") as file:
                    file.write(text)
        else:
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
    _report(fd, init=init)  # the caller stops a run by killing init, which this process then reaps
    os.waitpid(init, 0)  # returns once the kernel has killed and reaped everything in the namespace
    os._exit(0)


def _mount_tmp(libc: Any, job: dict[str, Any], owner: int) -> int:
    """A private tmpfs on /tmp holding the program in `WORKDIR`; returns an open fd of its stdin."""
    size = f"size={job['limits']['disk_mb']}m,mode=0755".encode()
    _call(libc.mount, b"tmpfs", b"/tmp", b"tmpfs", _NOSUID | _NODEV, size)
    os.mkdir(WORKDIR, 0o700)
    os.chown(WORKDIR, job["uid"], job["gid"])
    _write(f"{WORKDIR}/main.py", job["code"], job["uid"], job["gid"])
    _write("/tmp/.stdin", job["stdin"], owner, owner)
    stdin_fd = os.open("/tmp/.stdin", os.O_RDONLY)
    os.unlink("/tmp/.stdin")
    return stdin_fd


def _init_main(libc: Any, job: dict[str, Any]) -> None:
    """Pid 1 of the namespace: builds the filesystem view, starts the program as the run's uid, reports its status."""
    fd, userns, step = job["status_fd"], job["mode"] == "userns", "prctl(PDEATHSIG)"
    try:
        _call(libc.prctl, _PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        # The caller's sweep finds what is left of the run by this namespace (in the userns path it shares its uid).
        _report(fd, pidns=os.readlink("/proc/self/ns/pid"))
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
        stdin_fd = _mount_tmp(libc, job, job["uid"] if userns else 0)
        if userns:
            # /tmp read-only as in the root path, where root owns it: only the run's directory stays writable.
            step = f"making {WORKDIR} the only writable directory"
            _call(libc.mount, WORKDIR.encode(), WORKDIR.encode(), None, _BIND, None)
            _call(libc.mount, None, b"/tmp", None, _REMOUNT | _BIND | _RDONLY | _NOSUID | _NODEV, None)
            for hidden in job["hide"]:  # the caller's own files (home, runtime directory) that its uid could read
                step = f"hiding {hidden}"  # behind an empty, read-only directory that even its owner cannot open
                _call(libc.mount, b"tmpfs", hidden.encode(), b"tmpfs", _RDONLY | _NOSUID | _NODEV, b"size=4k,mode=0")
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


def _rlimits(limits: dict[str, Any], extra_processes: int) -> list[tuple[str, tuple[int, int]]]:
    megabyte = 1 << 20
    return [
        ("RLIMIT_CPU", (limits["cpu_s"], limits["cpu_s"] + 1)),  # SIGXCPU, then SIGKILL
        ("RLIMIT_AS", (limits["memory_mb"] * megabyte,) * 2),
        ("RLIMIT_NPROC", (limits["max_processes"] + extra_processes,) * 2),
        ("RLIMIT_FSIZE", (limits["max_file_mb"] * megabyte,) * 2),
        ("RLIMIT_NOFILE", (limits["max_open_files"],) * 2),
        ("RLIMIT_CORE", (0, 0)),
    ]


def _set_rlimits(limits: dict[str, Any], extra_processes: int) -> None:
    for name, limit in _rlimits(limits, extra_processes):
        resource.setrlimit(getattr(resource, name), limit)


def _exec_program(libc: Any, job: dict[str, Any], stdin_fd: int) -> None:
    uid, gid, userns, step = job["uid"], job["gid"], job["mode"] == "userns", "setting resource limits"
    try:
        os.dup2(stdin_fd, 0)
        os.close(stdin_fd)
        os.chdir(WORKDIR)
        os.umask(0o077)
        _set_rlimits(job["limits"], USERNS_EXTRA_PROCESSES if userns else 0)
        if userns:  # already the caller's uid; setgroups is denied in the namespace, and it must not reach init
            step = "starting a session"
            os.setsid()
        else:
            step = f"dropping to uid {uid} / gid {gid}"
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        _call(libc.prctl, _PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        step = f"running {job['python']} as uid {uid}"
        os.execve(job["python"], [job["python"], "-I", "main.py"], ENV)
    except Exception as error:
        _report(job["status_fd"], error=_failed(step, error))
    os._exit(127)


def _bwrap_main(libc: Any, job: dict[str, Any]) -> None:
    """The bwrap path: bubblewrap builds the namespaces (its pid 1 runs the program as pid 2); this process waits."""
    fd, limits, step = job["status_fd"], job["limits"], "starting bwrap"
    try:
        _call(libc.prctl, _PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        program, stdin = os.memfd_create("main.py"), os.memfd_create("stdin")  # no pipe buffer to fill
        for memfd, text in [(program, job["code"]), (stdin, job["stdin"])]:
            os.write(memfd, text.encode("utf-8", "replace"))
            os.lseek(memfd, 0, os.SEEK_SET)
        status_r, status_w = os.pipe()
        command = ["bwrap", "--unshare-all", "--unshare-user", "--uid", str(INNER_ID), "--gid", str(INNER_ID)]
        command += ["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--ro-bind", "/", "/"]
        command += ["--proc", "/proc", "--perms", "0755", "--size", "4096", "--tmpfs", "/tmp"]  # as in the root path
        command += ["--perms", "0700", "--size", str(limits["disk_mb"] << 20), "--tmpfs", WORKDIR]
        command += ["--file", str(program), f"{WORKDIR}/main.py", "--remount-ro", "/tmp"]
        for hidden in job["hide"]:
            command += ["--perms", "0000", "--tmpfs", hidden, "--remount-ro", hidden]
        command += ["--chdir", WORKDIR, "--clearenv", "--json-status-fd", str(status_w)]
        for key, value in ENV.items():
            command += ["--setenv", key, value]
        # The rlimits are set inside, by a shim: RLIMIT_NPROC set before bwrap creates its user namespace would also
        # cap the caller's other processes (the namespace's parent level takes its creator's limit).
        rlimits = dict(_rlimits(limits, BWRAP_EXTRA_PROCESSES))
        shim = f"import os, resource as r\nfor name, limit in {rlimits!r}.items():\n    r.setrlimit(getattr(r, name), limit)\n"
        shim += f"os.execv({job['python']!r}, [{job['python']!r}, '-I', 'main.py'])"
        command += ["--", job["python"], "-I", "-S", "-c", shim]
        bwrap = os.fork()
        if bwrap == 0:
            os.dup2(stdin, 0)
            os.set_inheritable(fd, False)
            _call(libc.prctl, _PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            _call(libc.prctl, _PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            os.set_inheritable(program, True)
            os.set_inheritable(status_w, True)
            os.execvp("bwrap", command)
        os.close(status_w)
        step = "waiting for bwrap"
        statuses = _bwrap_statuses(fd, status_r, first=True)
        _, status = os.waitpid(bwrap, 0)
        statuses |= _bwrap_statuses(fd, status_r, first=False)
        with contextlib.suppress(ChildProcessError):  # bwrap does not wait for its pid 1: this subreaper does
            while True:
                os.wait()
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # the program's, reaped by that pid 1
    except Exception as error:
        _report(fd, error=_failed(step, error))
        os._exit(1)
    if "exit-code" not in statuses:  # bwrap itself failed (its stderr says why)
        _report(fd, error=f"bwrap exited with {os.waitstatus_to_exitcode(status)} before the program ended")
        os._exit(1)
    code = statuses["exit-code"]
    returncode = -(code - 128) if code > 128 else code  # bwrap reports death by signal N as 128 + N
    _report(fd, returncode=returncode, cpu_s=round(usage.ru_utime + usage.ru_stime, 3))
    os._exit(0)


def _bwrap_statuses(fd: int, status_r: int, first: bool) -> dict[str, Any]:
    """bwrap's JSON status: its first line (the sandbox's pid 1, reported on), or all the rest once bwrap is gone."""
    data, found = b"", {}
    while chunk := os.read(status_r, 1 if first else 4096):
        data += chunk
        if first and chunk == b"\n":
            found = json.loads(data)
            _report(fd, init=found["child-pid"], pidns=os.readlink(f"/proc/{found['child-pid']}/ns/pid"))
            return found
    for line in data.splitlines():
        found |= json.loads(line)
    return found


if __name__ == "__main__":
    _launcher_main()
