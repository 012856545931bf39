"""Ray's worker shim for clusters whose workers fork from the zygote (`worker_zygote.use_zygote_setup_worker`).

Ray starts every worker of a job that has a runtime env through a shim, ``python setup_worker.py default_worker.py
ARGS --language=PYTHON --serialized-runtime-env-context=JSON``: it applies the context (environment variables, the
``py_executable``) and execs the worker through ``bash``. Ray's own shim imports Ray to read that JSON, ~0.45
CPU-seconds per worker; with the zygote the worker itself costs less than that. This one reads it with the standard
library. Where the context asks for environment variables and the zygote's launcher only, it applies the variables as
Ray does and becomes the launcher; any other context goes to Ray's own shim, unchanged. (Ray's raylet recognises the
shim by its file name containing ``setup_worker.py``.)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import sys

LAUNCHER_MODULE = "nemo_rl_clone.distributed.worker_zygote"


def zygote_socket(context: dict) -> str | None:
    """The zygote's socket where ``context`` asks for nothing but environment variables and the zygote's launcher
    (`worker_zygote.launcher_command`) on this interpreter; else None."""
    if context.get("command_prefix") or context.get("override_worker_entrypoint") or context.get("java_jars"):
        return None
    words = shlex.split(context.get("py_executable") or "")
    if len(words) == 5 and words[0] == sys.executable and words[1:4] == ["-m", LAUNCHER_MODULE, "launch"]:
        return words[4]
    return None


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--serialized-runtime-env-context", default="{}")
    parser.add_argument("--language")
    known, worker_argv = parser.parse_known_args(argv)
    context = json.loads(known.serialized_runtime_env_context or "{}")
    socket_path = zygote_socket(context) if known.language == "PYTHON" else None
    if socket_path is None:
        spec = importlib.util.find_spec("ray")  # finds the package without importing it
        assert spec is not None and spec.submodule_search_locations
        ray_shim = os.path.join(spec.submodule_search_locations[0], "_private", "workers", "setup_worker.py")
        os.execv(sys.executable, [sys.executable, ray_shim, *argv])
    for key, value in (context.get("env_vars") or {}).items():
        # as Ray's `update_envs`: ${X} expands, and one naming an unset variable becomes empty
        os.environ[key] = re.sub(r"\$\{[A-Z0-9_]+\}", "", os.path.expandvars(value))
    from nemo_rl_clone.distributed.worker_zygote import launch

    launch(socket_path, worker_argv)


if __name__ == "__main__":
    sys.path.pop(0)  # this file's folder: its modules must not shadow top-level names
    main(sys.argv[1:])
