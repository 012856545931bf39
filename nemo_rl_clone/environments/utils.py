"""The registry of the built-in environment actor classes and `create_env` to start any environment (NeMo-RL
v0.7.0's path, ``nemo_rl.environments.utils``; also importable from `nemo_rl_clone.environments`).

An ``env.<name>`` config section starts one environment; dataset rows whose ``task_name`` is ``<name>`` are scored
by it. Built-in names map to the classes below; a user's own environment names its class in its section
(``env_class``, see `config.CustomEnvConfig` and docs/environments.md). Kept import-light (no Ray, torch or
verifier libraries) so that loading configs never pays for them.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict

from nemo_rl_clone.utils.registry import Registry


class EnvRegistryEntry(TypedDict, total=False):
    """NeMo-RL's shape of one environment registry entry: the actor class's ``"pkg.mod.Cls"`` and, optionally, the
    processor its data uses by default."""

    actor_class_fqn: str
    default_processor: NotRequired[str]


# Environment name (the ``env.<name>`` config section and a sample's ``task_name``) -> actor class.
ENVIRONMENT_REGISTRY: Registry[Any] = Registry("environment", "env")
_FQNS: dict[str, str] = {}  # each registered name's "pkg.mod.Cls", to refuse registering another class under it


def register_env(env_name: str, actor_class_fqn: str) -> None:
    """Makes ``create_env(env_name, cfg)`` start the class at ``actor_class_fqn`` (``"pkg.mod.Cls"``), for code that
    builds configs in Python; a YAML config names the class in the section instead (``env.<name>.env_class``)."""
    if env_name in _FQNS and _FQNS[env_name] != actor_class_fqn:
        raise ValueError(f"environment {env_name!r} is already registered as {_FQNS[env_name]}")
    module, _, attribute = actor_class_fqn.rpartition(".")
    ENVIRONMENT_REGISTRY.register(env_name, f"{module}:{attribute}")
    _FQNS[env_name] = actor_class_fqn


_PACKAGE = "nemo_rl_clone.environments"
for _name, _fqn in {
    "math": f"{_PACKAGE}.math_environment.MathEnvironment",
    "math_multi_reward": f"{_PACKAGE}.math_multi_reward_environment.MathMultiRewardEnvironment",
    "reasoning_gym": f"{_PACKAGE}.reasoning_gym_environment.ReasoningGymEnvironment",
    "sliding_puzzle_game": f"{_PACKAGE}.games.sliding_puzzle.SlidingPuzzleEnvironment",
    "tool_use": f"{_PACKAGE}.tool_use_environment.ToolUseEnvironment",
    "code": f"{_PACKAGE}.code_environment.CodeEnvironment",
    "code_jaccard": f"{_PACKAGE}.code_jaccard_environment.CodeJaccardEnvironment",
    "reward_model": f"{_PACKAGE}.reward_model_environment.RewardModelEnvironment",
    "agent": f"{_PACKAGE}.agent_environment.AgentEnvironment",
}.items():
    register_env(_name, _fqn)


def create_env(env_name: str, env_config: Any) -> Any:
    """Starts the environment ``env_name`` with its config section and returns the Ray actor handle at once.

    ``env_config``: a built-in environment's config (e.g. `MathEnvConfig`) or NeMo-RL's dict of its keys (validated
    here, one line per problem), or a `CustomEnvConfig` naming a user's class (plain classes are made Ray actors here;
    the class receives ``cfg.cfg``). Built-in actors build their verifier pools in the background; the first method
    call waits for that. The actor runs in the Python environment `ray_actor_environment` registers for its class
    (the driver's by default).
    """
    import ray

    from nemo_rl_clone.distributed.ray_actor_environment import get_actor_python_executable
    from nemo_rl_clone.environments.config import BUILTIN_ENV_CONFIGS, CustomEnvConfig, check_env_config
    from nemo_rl_clone.utils.config_validation import as_config
    from nemo_rl_clone.utils.imports import import_by_path

    name, cfg = env_name, env_config
    if isinstance(cfg, Mapping):  # NeMo-RL's section: typed by its schema, as a config file's would be
        schema = CustomEnvConfig if "env_class" in cfg else BUILTIN_ENV_CONFIGS.get(name)
        cfg = cfg if schema is None else as_config(cfg, schema, key=f"env.{name}")
    if isinstance(cfg, CustomEnvConfig):
        fqn, actor_cfg = cfg.env_class, cfg.cfg
    elif name in ENVIRONMENT_REGISTRY:
        fqn, actor_cfg = _FQNS[name], cfg
    else:
        raise ValueError(
            f"unknown environment {name!r}; registered: {', '.join(ENVIRONMENT_REGISTRY.names())}; for your own, "
            "pass a CustomEnvConfig naming its class"
        )
    check_env_config(name, actor_cfg)  # fail here, not as an actor that dies in its constructor
    actor_cls = import_by_path(fqn) if isinstance(cfg, CustomEnvConfig) else ENVIRONMENT_REGISTRY.resolve(name)
    env_cls = getattr(actor_cls, "__ray_actor_class__", actor_cls)
    if not hasattr(actor_cls, "__ray_actor_class__"):
        actor_cls = ray.remote(actor_cls)
    # An environment mostly waits on its verifiers or its game logic: it takes no logical CPU from the bundles.
    options: dict[str, Any] = {"num_cpus": 0}
    actor_options = getattr(env_cls, "actor_options", None)
    if callable(actor_options):  # e.g. a GPU for a model-backed environment; may refuse the config here, in the driver
        options.update(actor_options(actor_cfg))
    python = get_actor_python_executable(fqn)
    if python != sys.executable:
        options["runtime_env"] = {"py_executable": python}
    return actor_cls.options(**options).remote(actor_cfg)


def chunk_list_to_workers(to_chunk: list[Any], num_workers: int) -> list[list[Any]]:
    """``to_chunk`` split, in order, into consecutive chunks of ``ceil(len / num_workers)`` items (NeMo-RL's split of
    a batch over verifier workers): ``[1, 2, 3, 4, 5]`` over 3 is ``[[1, 2], [3, 4], [5]]``. With no more items than
    workers each item is its own chunk and the remaining workers get empty lists; with more, fewer than
    ``num_workers`` chunks can come back (``[1, 2, 3, 4]`` over 3 is ``[[1, 2], [3, 4]]``)."""
    if len(to_chunk) <= num_workers:
        return [[item] for item in to_chunk] + [[] for _ in range(num_workers - len(to_chunk))]
    chunk_size = -(-len(to_chunk) // num_workers)
    return [list(to_chunk[start : start + chunk_size]) for start in range(0, len(to_chunk), chunk_size)]
