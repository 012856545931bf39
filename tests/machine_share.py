"""Two xdist workers on one machine, without two tests fighting over it (pytest plugin, loaded by conftest).

The suite runs on two workers (`-n 2` in pyproject.toml): most tests leave a core idle while they
import, start processes or wait on Ray, so two at a time finish the suite sooner. The unit of work a worker takes is:

- a module: its tests run on one worker, in order, so a module fixture (an engine, a policy worker) starts once;
- an ``xdist_group``: ``@pytest.mark.xdist_group("name")`` puts tests of any module into one unit, so they run one
  after another on one worker and never beside each other. ``"memory"``: tests that hold ~6-12 GB (SmolLM2 in a
  policy and an engine; two at once could exhaust 24 GiB, one beside a light test cannot). ``"system"``: tests that
  install Debian packages or run podman/Slurm (apt holds one lock machine-wide). Groups go first: they are the
  longest units, and a long unit started last would leave the other worker idle at the end.

``@pytest.mark.serial`` tests run alone: for tests that own something any other test could touch (fixed ports, all
of `/dev/shm`, a `ray.cluster_utils.Cluster`, which every other `ray.init()` here would attach to) or that assert a
wall-clock bound a busy neighbour could break. Kept with file locks shared by the workers of one run, taken around
the test's whole protocol (setup, call, teardown; outside pytest-timeout's clock): a serial test first closes a
turnstile, so the other worker starts no new test, then waits for its running test to end. Modules with a serial
test go last, so that they run back to back once the parallel part is done.
In one process (``-n 0``) only the reordering applies.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SERIAL = "serial"
# The run's folder (the workers' locks and their group table): the controller keeps it in its stash and hands it to
# each worker under this workerinput key.
_RUN_DIR = pytest.StashKey[Path]()
_RUN_DIR_INPUT = "machine_share_dir"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{SERIAL}: runs alone on the machine (tests/machine_share.py)")
    if getattr(config, "workerinput", None) is None and config.getoption("numprocesses", None):
        config.stash[_RUN_DIR] = Path(tempfile.mkdtemp(prefix="nrl-tests-"))  # the xdist controller


def pytest_unconfigure(config: pytest.Config) -> None:
    if _RUN_DIR in config.stash:
        shutil.rmtree(config.stash[_RUN_DIR], ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    node.workerinput[_RUN_DIR_INPUT] = str(node.config.stash[_RUN_DIR])


def _shared_dir(config: pytest.Config) -> Path | None:
    workerinput = getattr(config, "workerinput", None)
    return Path(workerinput[_RUN_DIR_INPUT]) if workerinput and _RUN_DIR_INPUT in workerinput else None


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Grouped tests first, modules with a serial test last, collection order otherwise (the same on every worker:
    xdist requires it). A worker also writes which test is in which group for the controller's scheduler (xdist's
    own way, a suffix on the test id, does nothing under pytest 9)."""
    serial_modules = {_module(item) for item in items if item.get_closest_marker(SERIAL)}
    groups = {item.nodeid: str(mark.args[0]) for item in items if (mark := item.get_closest_marker("xdist_group"))}
    items.sort(key=lambda item: 2 if _module(item) in serial_modules else 0 if item.nodeid in groups else 1)
    shared = _shared_dir(config)
    if shared is not None:
        table = shared / f"groups.{os.getpid()}.json"
        table.write_text(json.dumps(groups))
        table.replace(shared / "groups.json")  # both workers write the same table; a reader sees a whole one


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Scheduling units: an xdist group, or else a module (a module fixture then starts on one worker only)."""
    from xdist.scheduler import LoadScopeScheduling

    table = config.stash[_RUN_DIR] / "groups.json"

    class ModuleOrGroupScheduling(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # scopes are asked for once every worker has collected (and written the table)
                self.groups = json.loads(table.read_text()) if table.exists() else {}
            return self.groups.get(nodeid) or nodeid.split("::", 1)[0]

    return ModuleOrGroupScheduling(config, log)


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@contextlib.contextmanager
def machine_share(item: pytest.Item) -> Iterator[None]:
    """Holds the machine shared (any test) or alone (a serial test) while ``item`` runs."""
    locks = _shared_dir(item.config)
    if locks is None:
        yield
        return
    serial = item.get_closest_marker(SERIAL) is not None
    with contextlib.ExitStack() as held:
        # The turnstile keeps a waiting serial test from being overtaken by the other worker's next test.
        with contextlib.ExitStack() as turnstile:
            turnstile.enter_context(_flock(locks / "turnstile", fcntl.LOCK_EX))
            held.enter_context(_flock(locks / "machine", fcntl.LOCK_EX if serial else fcntl.LOCK_SH))
            if serial:
                held.push(turnstile.pop_all())  # keep it closed until the serial test ends
        yield


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    with machine_share(item):
        yield
