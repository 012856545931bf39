"""NeMo-RL v0.7.0's path of the actor-environment lookup (``nemo_rl.distributed.ray_actor_environment_registry``);
the code is `nemo_rl_clone.distributed.ray_actor_environment`. A facade (`nemo_rl_clone.facades`): nothing inside the
package imports it."""

from nemo_rl_clone.distributed.ray_actor_environment import (
    MCORE_EXECUTABLE,
    USE_SYSTEM_EXECUTABLE,
    VLLM_EXECUTABLE,
    get_actor_python_env,
)
from nemo_rl_clone.utils.unsupported_modules import refusing_getattr

__all__ = ["MCORE_EXECUTABLE", "USE_SYSTEM_EXECUTABLE", "VLLM_EXECUTABLE", "get_actor_python_env"]

__getattr__ = refusing_getattr(
    __name__, {"SGLANG_EXECUTABLE": "the SGLang generation backend; use policy.generation.backend: vllm"}
)
