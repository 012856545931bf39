"""Connecting this process to Ray (`init_ray`): attach to a running cluster or start a local one, with the worker
environment choices every run needs."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import ray
from ray._private import services

from nemo_rl_clone.distributed.reaper import register_temp_path, start_reaper
from nemo_rl_clone.utils.platform import check_torch_build

logger = logging.getLogger(__name__)

# Ray's session dir adds ~62 characters (`session_<date>_<pid>/sockets/plasma_store`) and unix sockets allow 107.
_MAX_RAY_TEMP_DIR_CHARS = 44


def starts_local_ray() -> bool:
    """Whether `init_ray` would start a local cluster (no ``RAY_ADDRESS``, no ``ray start`` cluster to attach to)."""
    return not ray.is_initialized() and _existing_cluster_address() is None


def _existing_cluster_address() -> str | None:
    """``RAY_ADDRESS``, else the cluster of the last ``ray start`` on this machine, else None. (Ray's
    ``address="auto"`` would also grab any other Ray instance running here, e.g. another user's test session.)"""
    address = services.canonicalize_bootstrap_address(None)  # type: ignore[arg-type]  # None means "look it up"
    if address is None or os.environ.get("RAY_ADDRESS"):
        return address
    # From the file the last `ray start` wrote: after a crash or a reboot it names a cluster that is gone, and
    # attaching to it would retry for minutes. Nothing listening there means nothing to attach to.
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except (OSError, ValueError):
        logger.warning(
            "Ignoring %s: it names the Ray cluster %s, where nothing answers (left by a `ray start` that did not "
            "stop); starting a local cluster",
            ray._private.utils.get_ray_address_file(None),
            address,
        )
        return None
    return address


def init_ray(log_dir: str | os.PathLike | None = None, num_cpus: int | None = None) -> None:
    """Connect this process to Ray; idempotent.

    Attaches to ``RAY_ADDRESS`` or else to the cluster of the last ``ray start`` on this machine if there is one
    (as ``ray.init()`` does), else starts a local single-node cluster with ``num_cpus`` logical CPUs (default: all
    cores). ``num_cpus`` is ignored when attaching. ``log_dir``: when a local cluster is started, Ray's session dir
    (worker logs) goes to ``<log_dir>/ray`` if that path is short enough for Ray's unix sockets; otherwise Ray's
    default temp dir is kept.

    Two environment choices are made for every worker:
    - Ray's ``uv run`` hook is switched off (unless ``RAY_ENABLE_UV_RUN_RUNTIME_ENV=1`` is set explicitly): under
      ``uv run`` it would start every worker through ``uv run`` in a copy of the repo, building a fresh venv per
      session (~1 min here). Workers use the driver's interpreter or the one `ray_actor_environment` names.
    - A driver-side ``OMP_NUM_THREADS`` is not inherited by a locally started cluster, so each actor gets Ray's
      default of ``max(1, floor(actor CPUs))`` threads instead of oversubscribing the cores. Pass ``env_vars`` to
      a worker group to choose otherwise.
    """
    if ray.is_initialized():
        return
    check_torch_build()  # fail before any worker trains on the CPU torch build of a GPU machine
    start_reaper()  # before Ray starts anything: whatever the run starts is killed when the driver is gone
    _disable_ray_uv_run_hook()
    address = _existing_cluster_address()
    if address is not None:
        if num_cpus is not None:
            logger.warning("init_ray: attaching to the Ray cluster at %s; num_cpus=%s is ignored", address, num_cpus)
        ray.init(address=address, log_to_driver=True)
        logger.info("Attached to the Ray cluster at %s", address)
        return
    temp_dir = _ray_temp_dir(log_dir)
    with _without_env("OMP_NUM_THREADS"):
        # "local": a new cluster, even where a stale `ray start` address file is left (see above)
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=True, _temp_dir=temp_dir)
    node = ray._private.worker._global_node
    if temp_dir is None and node is not None:  # Ray's session dir is in the system temp dir, not the run's log dir
        register_temp_path(node.get_session_dir_path())
    logger.info("Started a local Ray cluster: %s", ray.cluster_resources())


def _disable_ray_uv_run_hook() -> None:
    if os.environ.get("RAY_ENABLE_UV_RUN_RUNTIME_ENV") == "1":
        return
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"  # for processes started from here (e.g. `ray job submit`)
    # Ray reads the variable once at import; `ray.init` consults this module attribute at call time.
    from ray._private import ray_constants

    ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = False


def _ray_temp_dir(log_dir: str | os.PathLike | None) -> str | None:
    if log_dir is None:
        return None
    temp_dir = Path(log_dir).resolve() / "ray"
    if len(str(temp_dir)) > _MAX_RAY_TEMP_DIR_CHARS:
        logger.warning(
            "init_ray: %s is too long for Ray's unix sockets (max %d chars); Ray logs stay in its default temp dir",
            temp_dir,
            _MAX_RAY_TEMP_DIR_CHARS,
        )
        return None
    temp_dir.mkdir(parents=True, exist_ok=True)
    return str(temp_dir)


@contextlib.contextmanager
def _without_env(name: str) -> Iterator[None]:
    """Hide one environment variable from processes started inside the block (Ray's raylet copies the env)."""
    saved = os.environ.pop(name, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[name] = saved
