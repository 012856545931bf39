"""Which Python executable each Ray actor class runs in (worker environment isolation).

Actor classes are registered by fully qualified name (``"pkg.module.Class"``) with one of:
- `PY_EXECUTABLES.SYSTEM`: the driver's own interpreter (``sys.executable``), the default for unregistered classes;
- a `UvEnvironment`: a uv environment with the project plus some dependency groups (e.g. ``gpu`` for vLLM,
  ``mcore`` for Megatron), built on first use under ``<repo>/venvs/<name>`` with
  ``uv sync --locked --no-default-groups --group ...`` and reused afterwards; ``NRL_FORCE_REBUILD_VENVS=true``
  rebuilds it (once per process);
- an explicit path to a Python executable.

The environment is built on the machine that asks for it (the driver); on multi-node clusters the repo (and so
``venvs/``) must be on a shared filesystem, as with ``ray.sub`` mounts. Worker interpreters must be the driver's
Python version with the same Ray version: uv environments are created with the driver's interpreter and the
project's lock file, which guarantees both.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

FORCE_REBUILD_ENV_VAR = "NRL_FORCE_REBUILD_VENVS"
_REPO_ROOT = Path(__file__).resolve().parents[2]
# Written after a successful `uv sync` (holding the groups), so a failed or interrupted build is never reused.
_BUILD_MARKER = ".nrl-build-complete"


@dataclass(frozen=True)
class UvEnvironment:
    """A uv-managed environment: the project plus ``groups`` (dependency groups of pyproject.toml)."""

    name: str
    groups: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(f"UvEnvironment name must be a plain directory name, got {self.name!r}")


EnvironmentSpec = str | UvEnvironment


class PY_EXECUTABLES:
    """Ready-made environment specs."""

    SYSTEM: str = sys.executable
    # GPU vLLM (CUDA torch); on CPU machines vLLM already lives in the default environment.
    VLLM = UvEnvironment("vllm", ("gpu",))
    MCORE = UvEnvironment("mcore", ("mcore",))


# NeMo-RL's switch: NEMO_RL_PY_EXECUTABLES_SYSTEM=1 keeps every actor in the driver's interpreter (an image that
# already holds vLLM and Megatron); otherwise the vLLM and Megatron environments above. The vLLM workers take
# VLLM_EXECUTABLE when the driver lacks vLLM; Megatron workers run in the driver's interpreter unless registered.
USE_SYSTEM_EXECUTABLE = os.environ.get("NEMO_RL_PY_EXECUTABLES_SYSTEM", "0") == "1"
VLLM_EXECUTABLE: EnvironmentSpec = PY_EXECUTABLES.SYSTEM if USE_SYSTEM_EXECUTABLE else PY_EXECUTABLES.VLLM
MCORE_EXECUTABLE: EnvironmentSpec = PY_EXECUTABLES.SYSTEM if USE_SYSTEM_EXECUTABLE else PY_EXECUTABLES.MCORE


_ACTOR_ENVIRONMENTS: dict[str, EnvironmentSpec] = {}
_REBUILT_THIS_PROCESS: set[Path] = set()


def register_actor_environment(actor_class_fqn: str, spec: EnvironmentSpec) -> None:
    """Run actors of ``actor_class_fqn`` (e.g. ``"nemo_rl_clone.models....VllmGenerationWorker"``) in ``spec``."""
    if not isinstance(spec, (str, UvEnvironment)):
        raise TypeError(f"environment spec for {actor_class_fqn} must be a path or UvEnvironment, got {spec!r}")
    _ACTOR_ENVIRONMENTS[actor_class_fqn] = spec


def unregister_actor_environment(actor_class_fqn: str) -> None:
    """Back to the default (`PY_EXECUTABLES.SYSTEM`); no-op for an unregistered class."""
    _ACTOR_ENVIRONMENTS.pop(actor_class_fqn, None)


def get_actor_environment(actor_class_fqn: str) -> EnvironmentSpec:
    return _ACTOR_ENVIRONMENTS.get(actor_class_fqn, PY_EXECUTABLES.SYSTEM)


def get_actor_python_env(actor_class_fqn: str) -> str:
    """NeMo-RL's lookup (``nemo_rl.distributed.ray_actor_environment_registry``): the Python executable actors of
    ``actor_class_fqn`` run under, building nothing. A registered path as is; a uv environment's interpreter under
    ``venvs/`` (built when its first actor starts, `get_actor_python_executable`); for a class registered nowhere, the
    driver's interpreter, `PY_EXECUTABLES.SYSTEM` (NeMo-RL raises there: its actors each need an entry, here they
    run in the driver's environment unless registered)."""
    spec = get_actor_environment(actor_class_fqn)
    if isinstance(spec, UvEnvironment):
        return str(venv_python(_REPO_ROOT / "venvs" / spec.name))
    return spec


def get_actor_python_executable(actor_class_fqn: str) -> str:
    """Path of the Python executable for ``actor_class_fqn``, building its uv environment if needed.

    Raises:
        FileNotFoundError: a registered explicit executable does not exist or is not executable.
        RuntimeError: building a uv environment failed (the message carries uv's output).
    """
    spec = get_actor_environment(actor_class_fqn)
    if isinstance(spec, UvEnvironment):
        return str(ensure_uv_environment(spec))
    if not os.access(spec, os.X_OK):
        raise FileNotFoundError(
            f"Python executable {spec!r} registered for actor class {actor_class_fqn} does not exist or is not "
            "executable; fix the path given to register_actor_environment"
        )
    return spec


def force_rebuild_requested() -> bool:
    return os.environ.get(FORCE_REBUILD_ENV_VAR, "").strip().lower() in ("1", "true", "yes")


def uv_sync_command(env: UvEnvironment, repo_root: Path = _REPO_ROOT) -> list[str]:
    """The ``uv sync`` invocation that builds ``env`` (run with `uv_sync_environ`)."""
    uv = shutil.which("uv") or "uv"
    command = [uv, "sync", "--locked", "--no-default-groups", "--project", str(repo_root), "--python", sys.executable]
    for group in env.groups:
        command += ["--group", group]
    return command


def uv_sync_environ(venv_dir: Path) -> dict[str, str]:
    """Environment for `uv_sync_command`: the target venv, and no active venv to confuse uv."""
    environ = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    environ["UV_PROJECT_ENVIRONMENT"] = str(venv_dir)
    return environ


def venv_python(venv_dir: Path) -> Path:
    return venv_dir / "bin" / "python"


def ensure_uv_environment(env: UvEnvironment, repo_root: Path = _REPO_ROOT, venvs_dir: Path | None = None) -> Path:
    """Python executable of ``env``, built under ``venvs_dir`` (default ``<repo_root>/venvs``) when needed.

    A complete build for the same groups is reused as is; a missing, partial (failed) or differently-grouped one is
    synced. With ``NRL_FORCE_REBUILD_VENVS=true`` it is deleted and rebuilt, once per process (later actors of the
    same run reuse the fresh build). Concurrent builders wait on a file lock.
    """
    if not (repo_root / "pyproject.toml").is_file() or not (repo_root / "uv.lock").is_file():
        raise RuntimeError(
            f"uv environment {env.name!r} needs the project's source checkout (pyproject.toml and uv.lock) at "
            f"{repo_root}; install nemo_rl_clone from a checkout or register an explicit Python executable"
        )
    venvs_dir = venvs_dir if venvs_dir is not None else repo_root / "venvs"
    venv_dir = venvs_dir / env.name
    venvs_dir.mkdir(parents=True, exist_ok=True)
    marker = venv_dir / _BUILD_MARKER
    groups = " ".join(env.groups)
    with _file_lock(venvs_dir / f".{env.name}.lock"):
        rebuild = force_rebuild_requested() and venv_dir not in _REBUILT_THIS_PROCESS
        if rebuild and venv_dir.exists():
            logger.info("%s=true: deleting %s to rebuild it", FORCE_REBUILD_ENV_VAR, venv_dir)
            shutil.rmtree(venv_dir)
        if rebuild or not marker.is_file() or marker.read_text() != groups:
            _run_uv_sync(env, repo_root, venv_dir)
            marker.write_text(groups)
        if rebuild:
            _REBUILT_THIS_PROCESS.add(venv_dir)
    return venv_python(venv_dir)


def _run_uv_sync(env: UvEnvironment, repo_root: Path, venv_dir: Path) -> None:
    command = uv_sync_command(env, repo_root)
    logger.info("Building uv environment %r in %s: %s", env.name, venv_dir, " ".join(command))
    result = subprocess.run(command, env=uv_sync_environ(venv_dir), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            f"building uv environment {env.name!r} in {venv_dir} failed (exit {result.returncode}): "
            f"{' '.join(command)}\n{result.stderr.strip()[-4000:]}"
        )


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
