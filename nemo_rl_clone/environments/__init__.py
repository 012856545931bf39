"""Environments: registry of environment actor classes and `create_env` to start one.

Kept import-light (no Ray, torch or verifier libraries) so that loading configs never pays for them.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

# Environment name (the ``env.<name>`` config section and a sample's ``task_name``) -> actor class path.
ENVIRONMENT_REGISTRY: dict[str, str] = {
    "math": "nemo_rl_clone.environments.math_environment.MathEnvironment",
    "reasoning_gym": "nemo_rl_clone.environments.reasoning_gym_environment.ReasoningGymEnvironment",
}


def register_env(name: str, actor_class_fqn: str) -> None:
    """Makes ``create_env(name, cfg)`` start the ``@ray.remote`` class at ``actor_class_fqn`` (``"pkg.mod.Cls"``)."""
    if name in ENVIRONMENT_REGISTRY and ENVIRONMENT_REGISTRY[name] != actor_class_fqn:
        raise ValueError(f"environment {name!r} is already registered as {ENVIRONMENT_REGISTRY[name]}")
    ENVIRONMENT_REGISTRY[name] = actor_class_fqn


def create_env(name: str, cfg: Any) -> Any:
    """Starts the environment actor registered as ``name`` with its config section (e.g. `MathEnvConfig`).

    Returns the Ray actor handle at once; the actor builds its verifier pool in the background and its first
    method call waits for that. The actor runs in the Python environment `ray_actor_environment` registers for
    its class (the driver's by default).
    """
    if name not in ENVIRONMENT_REGISTRY:
        raise ValueError(f"unknown environment {name!r}; registered: {', '.join(sorted(ENVIRONMENT_REGISTRY))}")
    from nemo_rl_clone.distributed.ray_actor_environment import get_actor_python_executable
    from nemo_rl_clone.environments.config import check_env_config

    check_env_config(name, cfg)  # fail here, not as an actor that dies in its constructor
    fqn = ENVIRONMENT_REGISTRY[name]
    module_name, _, class_name = fqn.rpartition(".")
    actor_cls = getattr(importlib.import_module(module_name), class_name)
    # The environment actor only waits on its verifiers: it takes no logical CPU from the cluster's bundles.
    options: dict[str, Any] = {"num_cpus": 0}
    python = get_actor_python_executable(fqn)
    if python != sys.executable:
        options["runtime_env"] = {"py_executable": python}
    return actor_cls.options(**options).remote(cfg)
