"""Ray worker processes forked from a zygote that has imported torch, transformers and vLLM once.

A development option for machines where process starts dominate (the CPU test suite: a vLLM worker spends ~7-20
CPU-seconds importing before it does anything). Off unless ``NRL_RAY_WORKER_ZYGOTE`` names the unix socket of a
running zygote (``python -m nemo_rl_clone.distributed.worker_zygote serve SOCKET``) and ``RAY_RUNTIME_ENV_HOOK`` is
``nemo_rl_clone.distributed.worker_zygote.runtime_env_hook`` in the driver. The hook makes Ray start each worker
through the launcher (``... worker_zygote launch SOCKET default_worker.py ARGS``), which hands its arguments,
environment, folder and standard streams to the zygote and waits; the zygote forks a child that becomes the worker.
Ray starts the launcher through its worker shim, which imports Ray; `use_zygote_setup_worker` makes the clusters a
process starts use `zygote_setup_worker.py` instead, which does not.

What Ray sees stays true: the worker registers with the child's pid (Ray kills that pid), the launcher exits with
the child's status and passes on the signals it gets, and a child whose launcher is gone is killed. Never with CUDA
(a forked process cannot use a CUDA context of its parent; the zygote imports but never initializes CUDA, and the
option is for CPU machines). An actor that names its own interpreter (`ray_actor_environment`) keeps it.
"""

from __future__ import annotations

import array
import contextlib
import gc
import io
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time

SOCKET_ENV = "NRL_RAY_WORKER_ZYGOTE"
HOOK = "nemo_rl_clone.distributed.worker_zygote.runtime_env_hook"  # for RAY_RUNTIME_ENV_HOOK
PRELOAD = ("torch", "transformers", "vllm")  # ~all of a worker's import time; `vllm` also imports ray
PRELOAD_ENV = "NRL_RAY_WORKER_ZYGOTE_PRELOAD"  # comma-separated modules instead of PRELOAD (e.g. a test's light set)
_HEADER = struct.Struct("!I")
SETUP_WORKER = "zygote_setup_worker.py"  # Ray's raylet knows a worker shim by "setup_worker.py" in its name


def launcher_command(path: str) -> str:
    """Ray's ``py_executable`` for a worker forked from the zygote at ``path``."""
    return f"{sys.executable} -m nemo_rl_clone.distributed.worker_zygote launch {path}"


def runtime_env_hook(runtime_env: dict | None) -> dict | None:
    """Ray's ``RAY_RUNTIME_ENV_HOOK``: the job's workers start through the launcher when a zygote is named."""
    path = os.environ.get(SOCKET_ENV)
    if not path:
        return runtime_env
    runtime_env = dict(runtime_env or {})
    runtime_env.setdefault("py_executable", launcher_command(path))
    return runtime_env


def use_zygote_setup_worker() -> None:
    """Local Ray clusters this process starts from now on run `zygote_setup_worker.py` as their workers' shim instead
    of Ray's: a forked worker then costs no Ray import in its launcher (~0.45 CPU-seconds each)."""
    from ray._private import ray_constants

    # Ray joins the name to its workers' folder when it builds the worker command: an absolute path replaces it.
    ray_constants.SETUP_WORKER_FILENAME = os.path.join(os.path.dirname(os.path.abspath(__file__)), SETUP_WORKER)


def start_zygote(path: str, preload: str | None = None) -> subprocess.Popen:
    """Start ``serve(path)`` in a process of its own session and return once it listens (it binds before importing
    anything heavy). ``preload``: comma-separated modules instead of `PRELOAD`."""
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}  # each worker sets its own
    if preload is not None:
        env[PRELOAD_ENV] = preload
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a socket left by a zygote that was killed
    command = [sys.executable, "-m", "nemo_rl_clone.distributed.worker_zygote", "serve", path]
    process = subprocess.Popen(command, env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return process


# ---------------------------------------------------------------------------------------------------- the launcher


def _send_request(sock: socket.socket, argv: list[str], watch_fd: int) -> None:
    body = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    fds = array.array("i", [0, 1, 2, watch_fd])
    sock.sendmsg([_HEADER.pack(len(body)), body], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])


def launch(path: str, argv: list[str]) -> None:
    """Become ``python argv...`` as Ray started it, run by a child of the zygote; exit with the child's status."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as error:
        print(f"worker_zygote: no zygote at {path} ({error}); starting the worker as a plain process", file=sys.stderr)
        os.execv(sys.executable, [sys.executable, *argv])
    watch, _keep_open = os.pipe()  # the child's read end sees EOF when this process is gone, however it died
    _send_request(sock, argv, watch_fd=watch)
    os.close(watch)
    reader = sock.makefile("r")
    child = int(reader.readline())
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, lambda s, _f: os.kill(child, s))
    line = reader.readline()  # the zygote writes the child's wait status when it is reaped
    if not line:  # the zygote is gone: the child must not outlive this process
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
        sys.exit(1)
    status = int(line)
    if os.WIFSIGNALED(status):  # die of the same signal, as Ray would have seen the worker die
        fatal = os.WTERMSIG(status)
        if fatal != signal.SIGKILL:
            signal.signal(fatal, signal.SIG_DFL)
        os.kill(os.getpid(), fatal)
    sys.exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


# ------------------------------------------------------------------------------------------------------ the zygote


def _receive_request(conn: socket.socket) -> tuple[dict, list[int]]:
    fds = array.array("i")
    data, ancdata, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(4 * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    (size,) = _HEADER.unpack(data[: _HEADER.size])
    body = data[_HEADER.size :]
    while len(body) < size:
        more = conn.recv(size - len(body))
        if not more:
            raise ConnectionError("the launcher closed its connection mid-request")
        body += more
    return json.loads(body), list(fds)


def _become_worker(request: dict, fds: list[int], base_path: list[str]) -> None:
    """In the forked child: Ray's worker command as if run by a fresh interpreter. Never returns."""
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.set_wakeup_fd(-1)
    os.setpgid(0, 0)  # its own process group, as a worker started by the raylet has
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    watch = fds[3]
    for fd in fds[:3]:
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    argv = request["argv"]
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.path.dirname(os.path.abspath(argv[0])), *extra, *base_path]
    sys.argv = list(argv)
    import importlib

    importlib.invalidate_caches()
    if os.environ.get("PYTHONUNBUFFERED"):  # the streams were set up by the zygote's interpreter from its environment
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, io.TextIOWrapper):
                stream.reconfigure(write_through=True)
    import numpy

    numpy.random.seed()  # a fresh interpreter seeds numpy's global generator from the OS; forks would share one
    # OpenMP read the zygote's environment when torch loaded: apply the worker's, or OpenMP's default (all cores).
    threads = os.environ.get("OMP_NUM_THREADS", "")
    import torch

    torch.set_num_threads(int(threads) if threads.isdigit() else len(os.sched_getaffinity(0)))
    _watch_launcher(watch)
    import runpy

    runpy.run_path(argv[0], run_name="__main__")
    sys.exit(0)


def _watch_launcher(fd: int) -> None:
    """Exit at once when the launcher is gone (its end of the pipe closes however it died)."""
    import threading

    def wait() -> None:
        while os.read(fd, 1):
            pass
        os._exit(1)

    threading.Thread(target=wait, name="zygote-launcher-watch", daemon=True).start()


def serve(path: str) -> None:
    """Listen on ``path`` at once (launchers queue), import `PRELOAD`, then fork a worker per launcher."""
    server_pid = os.getpid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    zygote_path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base_path = [p for p in sys.path[1:] if p not in zygote_path]
    import importlib

    preload = os.environ.get(PRELOAD_ENV)
    for name in preload.split(",") if preload else PRELOAD:
        importlib.import_module(name)
    # Python's pre-fork recipe: the imported heap (~650k objects) moves out of the collector's reach, so a worker's
    # full collections skip it (vLLM collects 5 times while it builds an engine: 3.4 -> 2.1 CPU-s for the tiny model)
    # and do not write to the pages it shares with the zygote.
    gc.collect()
    gc.freeze()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    launchers: dict[int, socket.socket] = {}  # child pid -> its launcher's connection
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    try:
        while True:
            for key, _ in selector.select():
                if key.fileobj is listener:
                    conn, _ = listener.accept()
                    try:
                        request, fds = _receive_request(conn)
                    except (OSError, ValueError) as error:  # a launcher that died mid-request: serve the others
                        print(f"worker_zygote: a launcher's request was lost ({error})", file=sys.stderr)
                        conn.close()
                        continue
                    sys.stdout.flush()  # or the child writes the zygote's buffered text into the worker's log
                    sys.stderr.flush()
                    pid = os.fork()
                    if pid == 0:
                        selector.close()
                        for fd in (wake_r, wake_w):
                            os.close(fd)
                        for open_socket in (listener, conn, *launchers.values()):
                            open_socket.close()
                        _become_worker(request, fds, base_path)
                    for fd in fds:
                        os.close(fd)
                    conn.sendall(f"{pid}\n".encode())
                    launchers[pid] = conn
                    selector.register(conn, selectors.EVENT_READ, data=pid)
                elif key.fileobj == wake_r:
                    os.read(wake_r, 4096)
                elif isinstance(key.fileobj, socket.socket) and not key.fileobj.recv(1):  # its launcher is gone
                    selector.unregister(key.fileobj)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(key.data, signal.SIGKILL)
            _reap(launchers, selector)
    finally:
        if os.getpid() == server_pid:
            for pid in launchers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            os.unlink(path)


def _reap(launchers: dict[int, socket.socket], selector: selectors.BaseSelector) -> None:
    while launchers:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = launchers.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(KeyError):  # unregistered already when its launcher went first
                selector.unregister(conn)
            with contextlib.suppress(OSError):
                conn.sendall(f"{status}\n".encode())
            conn.close()


def main(argv: list[str]) -> None:
    if len(argv) >= 2 and argv[0] == "serve":
        serve(argv[1])
    elif len(argv) >= 3 and argv[0] == "launch":
        launch(argv[1], argv[2:])
    else:
        sys.exit(
            "usage: python -m nemo_rl_clone.distributed.worker_zygote serve SOCKET | launch SOCKET SCRIPT [ARG...]"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
