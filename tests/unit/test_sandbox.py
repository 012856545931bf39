"""Hostile programs in `run_in_sandbox`: each is contained, finishes within seconds and leaves nothing behind.

Each runs on both paths: ``root`` (this process, root) and ``userns``, where a real unprivileged uid of this session
(no passwd entry, so no other process on the machine has it) is the caller: a system interpreter it may execute
runs a copy of the sandbox's two modules and calls `run_in_sandbox` with mode ``auto``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from nemo_rl_clone.environments import sandbox
from nemo_rl_clone.environments.config import CodeEnvConfig
from nemo_rl_clone.environments.sandbox import (
    SandboxLimits,
    SandboxResult,
    SandboxUnavailableError,
    check_sandbox_available,
    run_in_sandbox,
)

# Runs alone (tests/machine_share.py): wall-clock bounds, and a fork bomb beside another test.
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="root path, and creating the userns path's user (CI runs as root)"),
    pytest.mark.serial,
]

LIMITS = SandboxLimits(wall_s=10.0, cpu_s=2, memory_mb=256, max_processes=8, max_output_bytes=4096)
REPO = Path(__file__).resolve().parents[2]
# The userns caller: away from the root path's per-run uids (UID_BASE + pid) and from any account.
USER_ID = 2_000_000_000 + secrets.randbelow(10**8)
# Runs jobs (a JSON list on stdin) one after another in one process; prints their results, or the exception.
DRIVER = """
import json, logging, sys
from dataclasses import asdict
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
sys.path.insert(0, sys.argv[1])
from nemo_rl_clone.environments import sandbox
results = []
for code, limits, stdin in json.loads(sys.stdin.read()):
    try:
        results.append(asdict(sandbox.run_in_sandbox(code, sandbox.SandboxLimits(**limits), stdin)))
    except Exception as error:
        results.append({"exception": type(error).__name__, "message": str(error)})
print(json.dumps(results))
"""


def processes_of(uid: int) -> list[int]:
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            uids = Path(f"/proc/{name}/status").read_text().split("Uid:")[1].split()[:4]
        except (OSError, IndexError):
            continue
        if str(uid) in uids:
            found.append(int(name))
    return found


@dataclass
class Runner:
    """Runs programs on one path: ``mode`` root (here) or userns (as `USER_ID`, through `DRIVER`)."""

    mode: str
    copy: str = ""
    log: str = ""
    calls: list[Any] = field(default_factory=list)

    @property
    def as_user(self) -> dict[str, Any]:
        """`subprocess` arguments that start a process as the run's caller."""
        return {} if self.mode == "root" else {"user": USER_ID, "group": USER_ID, "extra_groups": []}

    def caller(self, jobs: list[tuple[str, SandboxLimits, str]]) -> subprocess.Popen[str]:
        payload = json.dumps([(code, asdict(limits), stdin) for code, limits, stdin in jobs])
        python = sys.executable if self.mode == "root" else sandbox.sandbox_python(SandboxLimits())
        command = [python, "-I", "-c", DRIVER, self.copy or str(REPO)]
        caller = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd="/",
            **self.as_user,
        )
        assert caller.stdin is not None
        caller.stdin.write(payload)
        caller.stdin.close()
        return caller

    def many(self, jobs: list[tuple[str, SandboxLimits, str]]) -> list[SandboxResult]:
        if self.mode == "root":
            return [run_in_sandbox(code, limits, stdin) for code, limits, stdin in jobs]
        caller = self.caller(jobs)
        assert caller.stdout is not None and caller.stderr is not None
        out, self.log = caller.stdout.read(), caller.stderr.read()
        caller.wait(30)
        results = []
        for result in json.loads(out or "null") or pytest.fail(f"the caller failed: {self.log}"):
            if "exception" in result:
                raise {"ValueError": ValueError}.get(result["exception"], SandboxUnavailableError)(result["message"])
            results.append(SandboxResult(**result))
        return results

    def __call__(
        self, code: str, limits: SandboxLimits = LIMITS, stdin: str = "", max_wall_s: float = 8.0, others: int = 0
    ) -> SandboxResult:
        """Runs ``code`` and checks what every run must guarantee: bounded time, nothing left running (but
        ``others``, the test's own process of the caller's uid)."""
        start = time.monotonic()
        if self.mode != "root" and limits.mode == "auto":  # the path by name: no trial run of auto's before each run
            limits = replace(limits, mode=self.mode)  # type: ignore[arg-type]
        (result,) = self.many([(code, limits, stdin)])
        assert time.monotonic() - start < max_wall_s, result
        assert result.mode == self.mode
        assert [pid for pid in processes_of(result.uid if self.mode == "root" else USER_ID) if pid != others] == []
        assert result.reason
        return result


@pytest.fixture(scope="module")
def userns_copy() -> Iterator[str]:
    """The sandbox's modules where `USER_ID` can read them (a checkout under /root is closed to it)."""
    copy = tempfile.mkdtemp(prefix="sandbox_userns_")
    package = Path(copy, "nemo_rl_clone", "environments")
    package.mkdir(parents=True)
    for name in ("nemo_rl_clone/__init__.py", "nemo_rl_clone/environments/__init__.py"):
        Path(copy, name).write_text("")
    for name in ("sandbox.py", "sandbox_launcher.py"):
        shutil.copy(REPO / "nemo_rl_clone" / "environments" / name, package / name)
    for path in [Path(copy), *Path(copy).rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    probe = ["unshare", "--user", "--map-root-user", "--mount", "--pid", "--net", "--ipc", "--fork", "true"]
    if shutil.which("unshare") and subprocess.run(probe, user=USER_ID, group=USER_ID, capture_output=True).returncode:
        pytest.skip("unprivileged user namespaces do not work on this machine")
    yield copy
    shutil.rmtree(copy)


@pytest.fixture(params=["root", "userns", "bwrap"])
def run(request: pytest.FixtureRequest) -> Runner:
    if request.param == "root":
        return Runner("root")
    if request.param == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed (Debian: bubblewrap); CI covers the root and userns paths")
    return Runner(request.param, request.getfixturevalue("userns_copy"))


@pytest.fixture
def outside_paths() -> Iterator[list[Path]]:
    paths = [Path(f"/tmp/pwned_{secrets.token_hex(4)}"), REPO / f"pwned_{secrets.token_hex(4)}"]
    yield paths
    for path in paths:
        assert not path.exists(), f"the sandbox wrote {path}"


def test_normal_program_prints_and_exits_0(run: Runner) -> None:
    result = run("import sys\nprint('hello', sys.version_info[0])\nprint(input()[::-1])", stdin="abc\n")
    assert (result.status, result.returncode, result.stdout) == ("ok", 0, "hello 3\ncba\n")
    assert result.wall_s < 5.0


def test_raising_program_is_an_error_with_its_traceback(run: Runner) -> None:
    result = run("def f():\n    raise ValueError('boom')\nf()")
    assert (result.status, result.returncode) == ("error", 1)
    assert "Traceback" in result.stderr and "ValueError: boom" in result.stderr
    assert "ValueError: boom" in result.reason


def test_infinite_loop_hits_the_cpu_limit(run: Runner) -> None:
    result = run("while True:\n    pass", SandboxLimits(wall_s=10.0, cpu_s=1))
    assert result.status == "timeout"
    assert "SIGXCPU" in result.reason and "cpu limit 1 s" in result.reason


def test_sleeping_program_hits_the_wall_clock_limit(run: Runner) -> None:
    result = run("import time\ntime.sleep(100)", SandboxLimits(wall_s=1.0))
    assert result.status == "timeout"
    assert result.reason == "wall-clock limit 1.0 s exceeded"
    assert 1.0 <= result.wall_s < 3.0


def test_fork_bomb_is_capped_and_every_process_is_gone_afterwards(run: Runner) -> None:
    result = run("import os\nwhile True:\n    os.fork()")
    assert result.status == "error"
    assert "BlockingIOError" in result.stderr  # fork() fails once the run has max_processes processes
    subprocess.run(["true"], check=True)  # the caller can still start processes


def test_the_program_may_run_max_processes_processes(run: Runner) -> None:
    # Userns path: RLIMIT_NPROC also counts the launcher and init (the same uid), so the limit is raised by 2.
    code = "import os, time\nn = 1\ntry:\n    while os.fork():\n        n += 1\nexcept BlockingIOError:\n    print(n)\n"
    code += "else:\n    time.sleep(100)"  # every child sleeps on: they count until the namespace goes
    result = run(code, SandboxLimits(max_processes=5))
    assert (result.status, result.stdout) == ("ok", "5\n")


def test_huge_allocation_is_a_memory_error(run: Runner) -> None:
    result = run("b = bytearray(10**10)")
    assert result.status == "memory"
    assert result.stderr.strip().endswith("MemoryError")


def test_writes_outside_its_directory_fail(run: Runner, outside_paths: list[Path]) -> None:
    tmp_file, repo_file = outside_paths
    code = "\n".join(
        [
            f"for path in ({str(tmp_file)!r}, {str(repo_file)!r}, '/var/tmp/x', '/dev/shm/x', '/etc/x', '../x'):",
            "    try:",
            "        open(path, 'w').write('pwned')",
            "        print('wrote', path)",
            "    except OSError as error:",
            "        print('refused', path, type(error).__name__)",
            "open('mine.txt', 'w').write('fine')",
            "print(open('mine.txt').read())",
        ]
    )
    result = run(code)
    assert result.status == "ok"
    assert "wrote" not in result.stdout and result.stdout.count("refused") == 6
    assert result.stdout.endswith("fine\n")  # its own directory is writable


def test_shell_and_subprocess_writes_are_contained(run: Runner, outside_paths: list[Path]) -> None:
    tmp_file, repo_file = outside_paths
    code = f"import os, subprocess\nos.system('echo hi > {tmp_file}')\nsubprocess.run(['sh', '-c', 'echo hi > {repo_file}'])"
    result = run(code)
    assert result.status == "ok"
    assert "Permission denied" in result.stderr or "Read-only" in result.stderr


def test_parent_environment_is_invisible(run: Runner, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = f"s3cr3t-{secrets.token_hex(8)}"
    monkeypatch.setenv("SANDBOX_TEST_SECRET", secret)
    code = f"""
import os
print(dict(os.environ))
for pid in (os.getppid(), 1, {os.getpid()}, {os.getppid()}):
    try:
        print(pid, open(f'/proc/{{pid}}/environ', 'rb').read())
    except OSError as error:
        print(pid, type(error).__name__)
"""
    result = run(code)
    assert result.status == "ok"
    assert secret not in result.stdout + result.stderr
    assert "SANDBOX_TEST_SECRET" not in result.stdout


def test_no_socket_reaches_anything(run: Runner) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code = f"""
import socket
for address in (('127.0.0.1', {port}), ('8.8.8.8', 53), ('localhost', {port})):
    try:
        socket.create_connection(address, timeout=2).close()
        print('connected', address)
    except OSError as error:
        print('refused', address, type(error).__name__, error)
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('8.8.8.8', 53))
    print('sent udp')
except OSError as error:
    print('refused udp', error)
"""
        result = run(code)
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert result.status == "ok"
    assert "connected" not in result.stdout and "sent udp" not in result.stdout
    assert result.stdout.count("\nrefused") == 3  # bwrap brings a loopback of its own up: "Connection refused"


@pytest.mark.parametrize("code", ["while True:\n    print('x' * 1000)", "print('x' * 10**8)"])
def test_huge_output_is_cut_at_the_cap(run: Runner, code: str) -> None:
    result = run(code, SandboxLimits(max_output_bytes=4096))
    assert result.status == "output_limit"
    assert len(result.stdout) == 4096 and set(result.stdout) <= {"x", "\n"}


def test_huge_output_beyond_memory_is_a_memory_error(run: Runner) -> None:
    result = run("print('x' * 10**9)", SandboxLimits(memory_mb=512, max_output_bytes=4096))
    assert result.status == "memory"


def test_killing_its_parent_or_others_fails(run: Runner) -> None:
    victim = subprocess.Popen(["sleep", "30"], **run.as_user)  # userns: the same uid, kept apart by the pid namespace
    try:
        code = f"""
import os, signal
for name, kill in [
    ('parent', lambda: os.kill(os.getppid(), 9)),
    ('victim', lambda: os.kill({victim.pid}, 9)),
    ('caller', lambda: os.kill({os.getpid()}, 9)),
    ('everyone', lambda: os.kill(-1, 9)),
    ('parent group', lambda: os.killpg(os.getpgid(os.getppid()), 9)),
]:
    try:
        kill()
        print('sent', name, flush=True)
    except OSError as error:
        print('refused', name, type(error).__name__, flush=True)
"""
        result = run(code, others=victim.pid)
        assert victim.poll() is None, "the sandbox killed a process outside it"
    finally:
        victim.kill()
        victim.wait()
    if run.mode == "root":
        assert "refused parent PermissionError" in result.stdout
    else:  # its pid 1 has its uid, but the kernel drops SIGKILL sent to a namespace's init from inside it
        assert "sent parent" in result.stdout
    assert "refused victim ProcessLookupError" in result.stdout  # not even visible in its pid namespace
    assert "refused caller ProcessLookupError" in result.stdout
    # kill(-1) and killpg() reach only the program itself (root: the one process of its uid; userns: the one
    # process of its session), which dies of SIGKILL; the launcher lived to report it. bwrap: killpg() reaches
    # only its pid 1's group, which the program is not in.
    expected = ("ok", "exited with status 0") if run.mode == "bwrap" else ("killed", "killed by SIGKILL")
    assert (result.status, result.reason) == expected


@pytest.mark.parametrize("detach", ["", "os.setsid()\n    "])
def test_background_grandchild_is_killed_at_the_end(run: Runner, detach: str) -> None:
    code = f"import os, time\nif os.fork() == 0:\n    {detach}time.sleep(100)\nprint('parent exits')"
    result = run(code, max_wall_s=4.0)
    assert (result.status, result.stdout) == ("ok", "parent exits\n")


def test_wall_clock_kills_the_program_and_its_detached_child(run: Runner) -> None:
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\nprint(os.getpid(), flush=True)\ntime.sleep(100)"
    result = run(code, SandboxLimits(wall_s=0.5), max_wall_s=3.0)  # run() checks that no process is left
    assert result.status == "timeout" and sorted(result.stdout.split()) == ["2", "3"]


def test_file_size_and_disk_limits(run: Runner) -> None:
    big_file = run("open('big', 'wb').write(b'x' * 2 * 2**20)", SandboxLimits(max_file_mb=1))
    assert big_file.status == "error" and "File too large" in big_file.reason
    many = "for i in range(100):\n    open(f'f{i}', 'wb').write(b'x' * 2**20)"
    full_disk = run(many, SandboxLimits(max_file_mb=2, disk_mb=8))
    assert full_disk.status == "error" and "No space left on device" in full_disk.reason


def test_sees_only_its_own_processes_and_no_private_files(run: Runner) -> None:
    code = """
import os
print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))
print(os.path.exists('/tmp/ray'))
for path in ('/etc/shadow', '/root'):
    try:
        open(path).read() if path != '/root' else os.listdir(path)
        print('read', path)
    except OSError as error:
        print('refused', path, type(error).__name__)
"""
    result = run(code)
    assert result.status == "ok"
    pids, ray_dir, *rest = result.stdout.splitlines()
    assert pids == "[1, 2]" and ray_dir == "False"
    assert rest == ["refused /etc/shadow PermissionError", "refused /root PermissionError"]


def test_concurrent_runs_get_their_own_uids() -> None:
    from concurrent.futures import ThreadPoolExecutor

    run = Runner("root")
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: run("import os\nprint(os.getuid())"), range(4)))
    assert all(result.status == "ok" for result in results)
    assert len({result.stdout for result in results}) == 4


def test_check_sandbox_available_and_clear_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    check_sandbox_available(LIMITS)
    with pytest.raises(ValueError, match="memory_mb: must be >= 64"):
        run_in_sandbox("print(1)", SandboxLimits(memory_mb=1))
    with pytest.raises(ValueError, match=r"mode: choose from \['auto', 'root', 'userns', 'bwrap'\], got 'docker'"):
        run_in_sandbox("print(1)", SandboxLimits(mode="docker"))  # type: ignore[arg-type]
    assert CodeEnvConfig(sandbox_mode="docker").check() == [  # type: ignore[arg-type]
        ("sandbox_mode", "choose from ['auto', 'root', 'userns', 'bwrap'], got 'docker'")
    ]
    with pytest.raises(SandboxUnavailableError, match="no Python interpreter"):
        run_in_sandbox("print(1)", SandboxLimits(python="/root/missing/python3"))
    with pytest.raises(SandboxUnavailableError, match="mode 'userns' is for users other than root"):
        run_in_sandbox("print(1)", SandboxLimits(mode="userns"))
    # Neither path available: one line, and nothing runs.
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(sandbox, "_userns_problem", lambda: "sandbox_error: unshare: Operation not permitted")
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailableError) as refused:
        check_sandbox_available(LIMITS)
    assert str(refused.value) == (
        "no code sandbox here: not root (uid 1000), user namespaces do not work (sandbox_error: unshare: Operation not "
        "permitted) and bwrap is not on PATH; nothing runs unsandboxed"
    )
    with pytest.raises(SandboxUnavailableError, match=r"mode 'root' needs root .* running as uid 1000"):
        check_sandbox_available(SandboxLimits(mode="root"))


def test_the_path_is_chosen_automatically_and_named_in_the_log_once(
    userns_copy: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandbox, "_logged_modes", set())
    with caplog.at_level("INFO", logger=sandbox.__name__):
        assert [run_in_sandbox("pass", LIMITS).mode for _ in range(2)] == ["root", "root"]
    assert [record.getMessage() for record in caplog.records] == [
        "code sandbox path: root: namespaces and a uid of its own per run"
    ]
    user = Runner("userns", userns_copy)
    results = user.many([("print(1)", LIMITS, ""), ("print(2)", LIMITS, "")])
    assert [(result.mode, result.stdout, result.uid) for result in results] == [
        ("userns", "1\n", 1000),
        ("userns", "2\n", 1000),
    ]
    assert user.log == f"INFO code sandbox path: an unprivileged user namespace (uid {USER_ID} seen as 1000)\n"
    # Forced paths whose prerequisite is missing for this user: refused in one line, nothing runs.
    with pytest.raises(SandboxUnavailableError, match=r"^code sandbox mode 'root' needs root .* uid \d+; mode 'auto'"):
        user.many([("print(1)", SandboxLimits(mode="root"), "")])
    if shutil.which("bwrap") is None:
        with pytest.raises(SandboxUnavailableError, match=r"^code sandbox mode 'bwrap': bwrap is not on PATH"):
            user.many([("print(1)", SandboxLimits(mode="bwrap"), "")])


def test_setup_failure_is_a_sandbox_error_not_an_unsandboxed_run(run: Runner) -> None:
    # An interpreter the caller sees but the sandbox does not (/tmp is a fresh tmpfs there): exec fails inside.
    directory = Path(f"/tmp/sandbox_test_{secrets.token_hex(4)}")
    directory.mkdir(mode=0o755)
    try:
        (directory / "python3").write_text("#!/bin/sh\necho unsandboxed\n")
        (directory / "python3").chmod(0o755)
        result = run("print(1)", SandboxLimits(python=str(directory / "python3")))
    finally:
        (directory / "python3").unlink()
        directory.rmdir()
    assert result.status == "sandbox_error" and result.stdout == ""
    if run.mode == "bwrap":  # bwrap runs it and says why on stderr
        assert result.reason == "sandbox setup failed: bwrap exited with 1 before the program ended"
        assert result.stderr.startswith("bwrap: execvp /tmp/sandbox_test_") and "No such file" in result.stderr
    else:
        assert result.reason.startswith("sandbox setup failed: running /tmp/sandbox_test_")
        assert "No such file or directory" in result.reason


def test_a_dying_caller_takes_the_whole_sandbox_with_it(run: Runner) -> None:
    """A scorer killed mid-run (the verifier pool's deadline) leaves nothing behind: PDEATHSIG down the chain."""
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\ntime.sleep(100)"
    caller = run.caller([(code, SandboxLimits(wall_s=60), "")])
    try:
        # userns: the caller, the launcher, init, the program and its child; bwrap: and bwrap outside.
        uid, expected = USER_ID, 5 if run.mode == "userns" else 6
        deadline = time.monotonic() + 20
        while run.mode == "root" and uid == USER_ID and time.monotonic() < deadline:
            for name in filter(str.isdigit, os.listdir("/proc")):
                with contextlib.suppress(OSError, IndexError):
                    if Path(f"/proc/{name}/status").read_text().split("PPid:")[1].split()[0] == str(caller.pid):
                        uid, expected = sandbox.UID_BASE + int(name), 2  # the launcher's pid names the run's uid
            time.sleep(0.05)
        while len(processes_of(uid)) < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(processes_of(uid)) == expected, "the sandbox did not start"
    finally:
        caller.kill()
        caller.wait()
    deadline = time.monotonic() + 5
    while processes_of(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_of(uid) == []
