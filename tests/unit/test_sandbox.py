"""Hostile programs in `run_in_sandbox`: each is contained, finishes within seconds and leaves nothing behind."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemo_rl_clone.environments import sandbox
from nemo_rl_clone.environments.sandbox import (
    SandboxLimits,
    SandboxResult,
    SandboxUnavailableError,
    check_sandbox_available,
    run_in_sandbox,
)

# Runs alone (tests/machine_share.py): wall-clock bounds, and a fork bomb beside another test.
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the code sandbox needs root (CI runs as root)"),
    pytest.mark.serial,
]

LIMITS = SandboxLimits(wall_s=10.0, cpu_s=2, memory_mb=256, max_processes=8, max_output_bytes=4096)
REPO = Path(__file__).resolve().parents[2]


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


def run(code: str, limits: SandboxLimits = LIMITS, stdin: str = "", max_wall_s: float = 8.0) -> SandboxResult:
    """Runs ``code`` and checks what every run must guarantee: bounded time, nothing left running as its uid."""
    start = time.monotonic()
    result = run_in_sandbox(code, limits, stdin)
    assert time.monotonic() - start < max_wall_s, result
    assert processes_of(result.uid) == [], result
    assert result.reason
    return result


@pytest.fixture
def outside_paths() -> Iterator[list[Path]]:
    paths = [Path(f"/tmp/pwned_{secrets.token_hex(4)}"), REPO / f"pwned_{secrets.token_hex(4)}"]
    yield paths
    for path in paths:
        assert not path.exists(), f"the sandbox wrote {path}"


def test_normal_program_prints_and_exits_0() -> None:
    result = run("import sys\nprint('hello', sys.version_info[0])\nprint(input()[::-1])", stdin="abc\n")
    assert (result.status, result.returncode, result.stdout) == ("ok", 0, "hello 3\ncba\n")
    assert result.wall_s < 5.0


def test_raising_program_is_an_error_with_its_traceback() -> None:
    result = run("def f():\n    raise ValueError('boom')\nf()")
    assert (result.status, result.returncode) == ("error", 1)
    assert "Traceback" in result.stderr and "ValueError: boom" in result.stderr
    assert "ValueError: boom" in result.reason


def test_infinite_loop_hits_the_cpu_limit() -> None:
    result = run("while True:\n    pass", SandboxLimits(wall_s=10.0, cpu_s=1))
    assert result.status == "timeout"
    assert "SIGXCPU" in result.reason and "cpu limit 1 s" in result.reason


def test_sleeping_program_hits_the_wall_clock_limit() -> None:
    result = run("import time\ntime.sleep(100)", SandboxLimits(wall_s=1.0))
    assert result.status == "timeout"
    assert result.reason == "wall-clock limit 1.0 s exceeded"
    assert 1.0 <= result.wall_s < 3.0


def test_fork_bomb_is_capped_and_every_process_is_gone_afterwards() -> None:
    result = run("import os\nwhile True:\n    os.fork()")
    assert result.status == "error"
    assert "BlockingIOError" in result.stderr  # fork() fails once the run has max_processes processes
    subprocess.run(["true"], check=True)  # the caller can still start processes


def test_huge_allocation_is_a_memory_error() -> None:
    result = run("b = bytearray(10**10)")
    assert result.status == "memory"
    assert result.stderr.strip().endswith("MemoryError")


def test_writes_outside_its_directory_fail(outside_paths: list[Path]) -> None:
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


def test_shell_and_subprocess_writes_are_contained(outside_paths: list[Path]) -> None:
    tmp_file, repo_file = outside_paths
    code = f"import os, subprocess\nos.system('echo hi > {tmp_file}')\nsubprocess.run(['sh', '-c', 'echo hi > {repo_file}'])"
    result = run(code)
    assert result.status == "ok"
    assert "Permission denied" in result.stderr or "Read-only" in result.stderr


def test_parent_environment_is_invisible(monkeypatch: pytest.MonkeyPatch) -> None:
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


def test_no_socket_reaches_anything() -> None:
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
    assert result.stdout.count("refused") == 4


@pytest.mark.parametrize("code", ["while True:\n    print('x' * 1000)", "print('x' * 10**8)"])
def test_huge_output_is_cut_at_the_cap(code: str) -> None:
    result = run(code, SandboxLimits(max_output_bytes=4096))
    assert result.status == "output_limit"
    assert len(result.stdout) == 4096 and set(result.stdout) <= {"x", "\n"}


def test_huge_output_beyond_memory_is_a_memory_error() -> None:
    result = run("print('x' * 10**9)", SandboxLimits(memory_mb=512, max_output_bytes=4096))
    assert result.status == "memory"


def test_killing_its_parent_or_others_fails() -> None:
    victim = subprocess.Popen(["sleep", "30"])
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
        result = run(code)
        assert victim.poll() is None, "the sandbox killed a process outside it"
    finally:
        victim.kill()
        victim.wait()
    assert "refused parent PermissionError" in result.stdout
    assert "refused victim ProcessLookupError" in result.stdout  # not even visible in its pid namespace
    assert "refused caller ProcessLookupError" in result.stdout
    # kill(-1) and killpg() reach only the program itself (the one process of its uid), which dies of SIGKILL.
    assert result.status == "killed" and result.reason == "killed by SIGKILL"


@pytest.mark.parametrize("detach", ["", "os.setsid()\n    "])
def test_background_grandchild_is_killed_at_the_end(detach: str) -> None:
    code = f"import os, time\nif os.fork() == 0:\n    {detach}time.sleep(100)\nprint('parent exits')"
    result = run(code, max_wall_s=4.0)
    assert (result.status, result.stdout) == ("ok", "parent exits\n")


def test_file_size_and_disk_limits() -> None:
    big_file = run("open('big', 'wb').write(b'x' * 2 * 2**20)", SandboxLimits(max_file_mb=1))
    assert big_file.status == "error" and "File too large" in big_file.reason
    many = "for i in range(100):\n    open(f'f{i}', 'wb').write(b'x' * 2**20)"
    full_disk = run(many, SandboxLimits(max_file_mb=2, disk_mb=8))
    assert full_disk.status == "error" and "No space left on device" in full_disk.reason


def test_sees_only_its_own_processes_and_no_private_files() -> None:
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

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: run("import os\nprint(os.getuid())"), range(4)))
    assert all(result.status == "ok" for result in results)
    assert len({result.stdout for result in results}) == 4


def test_check_sandbox_available_and_clear_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    check_sandbox_available(LIMITS)
    with pytest.raises(ValueError, match="memory_mb: must be >= 64"):
        run_in_sandbox("print(1)", SandboxLimits(memory_mb=1))
    with pytest.raises(SandboxUnavailableError, match="no Python interpreter"):
        run_in_sandbox("print(1)", SandboxLimits(python="/root/missing/python3"))
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    with pytest.raises(SandboxUnavailableError, match=r"needs root .* running as uid 1000"):
        check_sandbox_available(LIMITS)


def test_setup_failure_is_a_sandbox_error_not_an_unsandboxed_run() -> None:
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
    assert result.reason.startswith("sandbox setup failed: running /tmp/sandbox_test_")
    assert "No such file or directory" in result.reason


def test_a_dying_caller_takes_the_whole_sandbox_with_it() -> None:
    """A scorer killed mid-run (the verifier pool's deadline) leaves nothing behind: PDEATHSIG down the chain."""
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\ntime.sleep(100)"
    caller = subprocess.Popen(
        [sys.executable, "-c", f"from {sandbox.__name__} import *\nrun_in_sandbox({code!r}, SandboxLimits(wall_s=60))"]
    )
    try:
        uid = None
        deadline = time.monotonic() + 20
        while uid is None and time.monotonic() < deadline:
            for name in filter(str.isdigit, os.listdir("/proc")):
                with contextlib.suppress(OSError, IndexError):
                    if Path(f"/proc/{name}/status").read_text().split("PPid:")[1].split()[0] == str(caller.pid):
                        uid = sandbox.UID_BASE + int(name)  # the launcher, whose pid names the run's uid
            time.sleep(0.05)
        assert uid is not None, "the sandbox did not start"
        while len(processes_of(uid)) < 2 and time.monotonic() < deadline:  # the program and its child
            time.sleep(0.05)
        assert len(processes_of(uid)) == 2
    finally:
        caller.kill()
        caller.wait()
    deadline = time.monotonic() + 5
    while processes_of(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_of(uid) == []
