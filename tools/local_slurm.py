"""A throw-away Slurm cluster of N nodes on this machine, for testing `ray.sub` (no systemd needed).

    python tools/local_slurm.py start [--nodes 2] [--cpus-per-node 1] [--dir /tmp/nrl-slurm]
    eval "$(python tools/local_slurm.py env)"      # export SLURM_CONF for sbatch/srun/squeue/...
    python tools/local_slurm.py status
    python tools/local_slurm.py stop

Each node is its own ``slurmd -N <name>`` listening on its own port, all on localhost, so a job of ``--nodes=2`` gets
two Slurm nodes on one machine. Installs the Debian packages (slurm-wlm, munge) if missing, starts ``munged`` only
if no munge daemon answers, and records in ``<dir>/state.json`` what it started: ``stop`` cancels the cluster's jobs
and stops exactly those daemons (a munged that was already running is left alone). Run as root (slurmd must be).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

DEFAULT_DIR = Path("/tmp/nrl-slurm")
PACKAGES = ("slurm-wlm", "munge")
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_RUN = Path("/run/munge")


@dataclass
class Daemon:
    """A process this tool started: pid plus its start time (so a reused pid is never signalled)."""

    name: str
    pid: int
    start_ticks: int


@dataclass
class State:
    nodes: list[str]
    conf: str
    started: list[Daemon] = field(default_factory=list)


class SlurmError(RuntimeError):
    pass


def _start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks), or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _alive(daemon: Daemon) -> bool:
    return _start_ticks(daemon.pid) == daemon.start_ticks


def _run(args: list[str], env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=120)
    if check and proc.returncode != 0:
        raise SlurmError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc


def ensure_packages() -> None:
    """apt-get install slurm-wlm and munge unless their daemons are already on this machine."""
    if all(shutil.which(tool) for tool in ("slurmctld", "slurmd", "sbatch", "munged")):
        return
    if shutil.which("apt-get") is None:
        raise SlurmError(
            "Slurm is not installed and there is no apt-get to install it (Debian packages slurm-wlm, munge)"
        )
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    _run(["apt-get", "update", "-qq"], env)
    _run(["apt-get", "install", "-y", "-qq", *PACKAGES], env)


def _munge_answers() -> bool:
    return shutil.which("munge") is not None and _run(["munge", "-n"], check=False).returncode == 0


def ensure_munge(state: State) -> None:
    """Start munged (as the munge user) unless a munge daemon already answers; records it in ``state``."""
    if _munge_answers():
        return
    if not MUNGE_KEY.exists():  # the Debian package creates one; make one if it was removed
        MUNGE_KEY.parent.mkdir(parents=True, exist_ok=True)
        MUNGE_KEY.write_bytes(os.urandom(1024))
    for path in (MUNGE_KEY.parent, MUNGE_RUN, Path("/var/lib/munge"), Path("/var/log/munge")):
        path.mkdir(parents=True, exist_ok=True)
        shutil.chown(path, "munge", "munge")
    MUNGE_KEY.chmod(0o400)
    shutil.chown(MUNGE_KEY, "munge", "munge")
    _run(["runuser", "-u", "munge", "--", "munged"])  # daemonises; writes its pid file once it serves
    pid_file = MUNGE_RUN / "munged.pid"
    _wait(lambda: _pid_in(pid_file) is not None and _munge_answers(), 15, "munged did not come up", [])
    pid = _pid_in(pid_file)
    assert pid is not None
    state.started.append(Daemon("munged", pid, _start_ticks(pid) or 0))


def _free_port(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def write_conf(directory: Path, nodes: int, cpus: int, mem_mb: int, base_port: int) -> State:
    """slurm.conf: one controller, ``nodes`` nodes ``nrl1..nrlN`` on localhost, each slurmd on its own port."""
    ports = [base_port + i for i in range(nodes + 1)]
    taken = [port for port in ports if not _free_port(port)]
    if taken:
        raise SlurmError(f"ports {taken} are in use; pass another --base-port")
    host = socket.gethostname().split(".")[0]
    names = [f"nrl{i + 1}" for i in range(nodes)]
    for sub in ("state", "log", "spool"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    node_lines = [
        f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={ports[i + 1]} CPUs={cpus} RealMemory={mem_mb}"
        for i, name in enumerate(names)
    ]
    conf = directory / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "# Written by tools/local_slurm.py: a test cluster on localhost.",
                "ClusterName=nrl",
                f"SlurmctldHost={host}(127.0.0.1)",
                f"SlurmctldPort={ports[0]}",
                "SlurmUser=root",
                "AuthType=auth/munge",
                f"StateSaveLocation={directory}/state",
                f"SlurmdSpoolDir={directory}/spool/%n",
                f"SlurmctldPidFile={directory}/slurmctld.pid",
                f"SlurmdPidFile={directory}/slurmd-%n.pid",
                f"SlurmctldLogFile={directory}/log/slurmctld.log",
                f"SlurmdLogFile={directory}/log/slurmd-%n.log",
                # linuxproc: no cgroups in a container. It tracks a step's processes by parentage, so a process that
                # re-parents itself to init escapes it: ray.sub must stop Ray itself (as it does).
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_CPU",
                "JobAcctGatherType=jobacct_gather/none",
                "AccountingStorageType=accounting_storage/none",
                "MpiDefault=none",
                "ReturnToService=2",
                "SchedulerType=sched/builtin",
                *node_lines,
                "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )
    )
    return State(nodes=names, conf=str(conf))


def _wait(ready: object, timeout_s: float, message: str, logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():  # type: ignore[operator]
        if time.monotonic() > deadline:
            tails = "".join(f"\n--- {log} (tail) ---\n{_tail(log)}" for log in logs)
            raise SlurmError(f"{message} within {timeout_s} s{tails}")
        time.sleep(0.5)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as error:
        return f"({error.strerror})"


def _pid_in(pid_file: Path) -> int | None:
    try:
        text = pid_file.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _daemon_from_pid_file(name: str, pid_file: Path, logs: list[Path]) -> Daemon:
    # The daemon creates the file before it writes its pid: an empty file is "not yet", not an error.
    _wait(lambda: _pid_in(pid_file) is not None, 20, f"{name} wrote no pid to {pid_file}", logs)
    pid = _pid_in(pid_file)
    assert pid is not None
    ticks = _start_ticks(pid)
    if ticks is None:
        raise SlurmError(f"{name} (pid {pid}) exited at start:\n{''.join(_tail(log) for log in logs)}")
    return Daemon(name, pid, ticks)


def node_states(conf: str) -> dict[str, str]:
    proc = _run(["sinfo", "-h", "-N", "-o", "%N %t"], {"SLURM_CONF": conf}, check=False)
    if proc.returncode != 0:
        return {}
    return dict(line.split() for line in proc.stdout.splitlines() if line.strip())


def load_state(directory: Path) -> State | None:
    path = directory / "state.json"
    if not path.exists():
        return None
    raw = json.loads(path.read_text())
    return State(nodes=raw["nodes"], conf=raw["conf"], started=[Daemon(**d) for d in raw["started"]])


def save_state(directory: Path, state: State) -> None:
    (directory / "state.json").write_text(json.dumps(asdict(state), indent=1))


def running(directory: Path) -> State | None:
    """The state of a cluster started here whose slurmctld and slurmds all still run, else None."""
    state = load_state(directory)
    if state is None:
        return None
    names = {d.name for d in state.started if _alive(d)}
    return state if {"slurmctld", *(f"slurmd-{n}" for n in state.nodes)} <= names else None


def start(directory: Path, nodes: int, cpus: int, mem_mb: int, base_port: int, timeout_s: float) -> State:
    """Start the cluster (or return the running one of ``directory`` if it has ``nodes`` nodes)."""
    existing = running(directory)
    if existing is not None:
        if len(existing.nodes) != nodes:
            raise SlurmError(f"a {len(existing.nodes)}-node cluster already runs from {directory}; stop it first")
        return existing
    if load_state(directory) is not None:  # a half-dead earlier cluster: stop its remains first
        stop(directory)
    if os.geteuid() != 0:
        raise SlurmError("slurmd must run as root (and apt-get too, to install Slurm)")
    ensure_packages()
    state = write_conf(directory, nodes, cpus, mem_mb, base_port)
    save_state(directory, state)  # from now on `stop` can clean up whatever follows
    ensure_munge(state)
    save_state(directory, state)
    env = {"SLURM_CONF": state.conf}
    log = directory / "log"
    # A fresh state dir every start: no jobs or node states left from an earlier cluster.
    _run(["slurmctld", "-f", state.conf, "-c", "-i"], env)
    state.started.append(_daemon_from_pid_file("slurmctld", directory / "slurmctld.pid", [log / "slurmctld.log"]))
    save_state(directory, state)
    for name in state.nodes:
        _run(["slurmd", "-f", state.conf, "-N", name], env)
        pid_file = directory / f"slurmd-{name}.pid"
        state.started.append(_daemon_from_pid_file(f"slurmd-{name}", pid_file, [log / f"slurmd-{name}.log"]))
        save_state(directory, state)
    logs = [log / "slurmctld.log", *(log / f"slurmd-{n}.log" for n in state.nodes)]
    _wait(
        lambda: (s := node_states(state.conf)) and all(s.get(n) == "idle" for n in state.nodes),
        timeout_s,
        f"nodes {state.nodes} not idle (sinfo: {node_states(state.conf)})",
        logs,
    )
    return state


def _terminate(daemon: Daemon, timeout_s: float = 15) -> None:
    if not _alive(daemon):
        return
    os.kill(daemon.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(daemon) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(daemon):
        os.kill(daemon.pid, signal.SIGKILL)


def stop(directory: Path) -> None:
    """Cancel the cluster's jobs (waiting for them to end), then stop the daemons this tool started, newest first."""
    state = load_state(directory)
    if state is None:
        return
    env = {"SLURM_CONF": state.conf}
    if any(d.name == "slurmctld" and _alive(d) for d in state.started):
        _run(["scancel", "--full", "--user", "root"], env, check=False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _run(["squeue", "-h"], env, check=False).stdout.strip():
            time.sleep(1)
    for daemon in reversed(state.started):
        _terminate(daemon)
    (directory / "state.json").unlink()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("start", "stop", "status", "env"))
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="private dir: conf, state, logs, pid files")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--cpus-per-node", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--mem-mb", type=int, default=8000, help="RealMemory per node")
    parser.add_argument("--base-port", type=int, default=16817, help="slurmctld's port; slurmds take the next ones")
    parser.add_argument("--timeout", type=float, default=60, help="seconds to wait for the nodes to be idle")
    args = parser.parse_args()
    directory: Path = args.dir.resolve()
    try:
        if args.action == "start":
            started = start(directory, args.nodes, args.cpus_per_node, args.mem_mb, args.base_port, args.timeout)
            print(f"Slurm nodes {','.join(started.nodes)} idle. Use it with:\nexport SLURM_CONF={started.conf}")
        elif args.action == "stop":
            stop(directory)
        elif args.action == "env":
            loaded = load_state(directory)
            if loaded is None:
                raise SlurmError(f"no cluster started from {directory}")
            print(f"export SLURM_CONF={loaded.conf}")
        else:
            state = running(directory)
            if state is None:
                print(f"no running cluster from {directory}")
                return 1
            print(json.dumps({"conf": state.conf, "nodes": node_states(state.conf)}))
    except SlurmError as error:
        print(f"local_slurm: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
