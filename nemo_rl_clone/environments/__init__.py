"""Environments: typed environment actors a rollout sends finished turns to (docs/environments.md).

`create_env`, `register_env` and the registry live in `nemo_rl_clone.environments.utils` (NeMo-RL v0.7.0's path);
they are re-exported here. Kept import-light (no Ray, torch or verifier libraries) so that loading configs never
pays for them.
"""

from nemo_rl_clone.environments.utils import ENVIRONMENT_REGISTRY, create_env, register_env

__all__ = ["ENVIRONMENT_REGISTRY", "create_env", "register_env"]
