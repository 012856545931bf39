"""The generation backend that ``generation.backend`` names, built by one factory for training (GRPO, distillation)
and evaluation.

The registry (`nemo_rl_clone.utils.registry`) holds each backend's class by ``"module:Class"`` path, not the class
itself: config validation reads the registered names (`GenerationConfig.check`), and the backends import that
config, so importing them here would make a cycle. Adding a backend is one entry whose class takes
`build_generation`'s arguments; ``generation.backend`` may also name a class by import path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nemo_rl_clone.utils.registry import Registry

if TYPE_CHECKING:
    from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster
    from nemo_rl_clone.models.generation.config import GenerationConfig
    from nemo_rl_clone.models.generation.interfaces import GenerationInterface

# Backend name -> its `GenerationInterface` class.
GENERATION_BACKENDS: Registry[Any] = Registry("generation backend", "generation.backend")
GENERATION_BACKENDS.register("vllm", "nemo_rl_clone.models.generation.vllm.vllm_generation:VllmGeneration")
# The policy's own workers sample: built from the policy (``policy=``), not from a cluster of its own.
GENERATION_BACKENDS.register(
    "megatron", "nemo_rl_clone.models.generation.megatron.megatron_generation:MegatronGeneration"
)


def build_generation(
    cluster: RayVirtualCluster,
    config: GenerationConfig,
    model_name: str,
    *,
    name_prefix: str | None = None,
    seed: int = 0,
    env_vars: dict[str, str] | None = None,
    weight_updates_during_generation: bool = False,
    hf_config_overrides: Mapping[str, Any] | None = None,
    record_routing: bool = False,
    policy: Any = None,
) -> GenerationInterface:
    """Start the workers of the ``config.backend`` backend on ``cluster``, serving ``model_name``.

    ``config`` was validated where it was loaded, which refuses a backend neither in `GENERATION_BACKENDS` nor an
    import path.
    ``name_prefix``: Ray actor names ``{name_prefix}-{rank}`` (None: the backend's default). The other arguments
    are the backend's, see `VllmGeneration`. ``policy``: the trained policy, which ``backend: megatron`` generates
    with (its workers sample; ``cluster`` and the engine arguments are then unused).
    """
    backend = GENERATION_BACKENDS.resolve(config.backend)
    if config.backend == "megatron":
        return backend(config, policy=policy)
    named = {} if name_prefix is None else {"name_prefix": name_prefix}
    generation: GenerationInterface = backend(
        cluster,
        config,
        model_name,
        seed=seed,
        env_vars=env_vars,
        weight_updates_during_generation=weight_updates_during_generation,
        hf_config_overrides=hf_config_overrides,
        **named,
        **({"record_routing": True} if record_routing else {}),
    )
    return generation
