"""NeMo-RL's Megatron generation backend, colocated: the Megatron policy's own workers sample
(`nemo_rl_clone.models.policy.workers.self_generation`), so a step has no refit and the sampled tokens' logprobs come
from the forward pass the trainer runs (``token_mult_prob_error`` is 1 up to the rounding of another batch shape).

It takes the `Policy` it generates with; NeMo-RL's stand-alone form (a generation cluster of its own, refitted over
a collective: ``colocated.enabled: false``) is refused when the config is validated. Policy and generation do not
import each other: the policy is passed in and called through its public `sharded_call`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ray
import torch

from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.distributed.weight_transfer import PackedTensors
from nemo_rl_clone.models.generation.interfaces import GenerationInterface, check_generation_input
from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.utils.unsupported_modules import UnsupportedFeatureError

_STAND_ALONE = (
    "a Megatron generation cluster of its own (policy.generation.colocated.enabled: false); the policy's workers "
    "generate (colocated)"
)


class MegatronGeneration(GenerationInterface):
    """Generation by ``policy``'s workers: one sampler per data-parallel rank of the policy.

    Args (NeMo-RL's): ``config`` the ``policy.generation`` section (read by the workers, which have it from the
    policy's config); ``policy`` the Megatron `Policy`, required; ``tokenizer``, ``name_prefix``, ``processor``
    and ``weights_path`` are NeMo-RL's and unused (the workers hold the tokenizer and the weights); ``cluster``
    must be None or the policy's: a cluster of its own is not supported yet."""

    # The refit module skips engines that sample with the trainer's own weights.
    shares_policy_weights = True

    def __init__(
        self,
        config: Any,
        tokenizer: Any = None,
        cluster: Any = None,
        policy: Any = None,
        name_prefix: str = "megatron_generation",
        processor: Any = None,
        weights_path: str | None = None,
    ) -> None:
        if policy is None:
            raise UnsupportedFeatureError(f"MegatronGeneration: not supported yet: {_STAND_ALONE}")
        if processor is not None:
            raise UnsupportedFeatureError("MegatronGeneration(processor=...): not supported yet: multimodal inputs")
        self.cfg = config
        self.policy = policy
        self.dp_size = policy.dp_size
        print(
            f"{name_prefix}: the policy's workers sample ({self.dp_size} data-parallel rank(s); no refit)", flush=True
        )

    def generate(self, data: BatchedDataDict, greedy: bool = False) -> BatchedDataDict:
        """Generate for every row (the interfaces module's formats); rows keep their order."""
        check_generation_input(data, self.policy.cfg.max_total_sequence_length)
        per_sample_stops = data.get("stop_strings")
        if per_sample_stops is not None and any(per_sample_stops):
            raise UserInputError(
                "stop_strings: not supported yet with policy.generation.backend megatron (it stops on token ids: "
                "policy.generation.stop_token_ids)"
            )
        keys = ("input_ids", "input_lengths", "seeds")
        return self.policy.sharded_call(
            "generate", BatchedDataDict({k: data[k] for k in keys if k in data}), None, greedy=greedy
        )

    def generate_async(self, data: BatchedDataDict, greedy: bool = False) -> Any:
        raise UnsupportedFeatureError(
            "MegatronGeneration.generate_async: not supported yet: asynchronous generation (async GRPO needs vLLM)"
        )

    def generate_text(self, data: BatchedDataDict, greedy: bool = False) -> BatchedDataDict:
        raise UnsupportedFeatureError(
            "MegatronGeneration.generate_text: not supported yet: text prompts (evaluation needs vLLM)"
        )

    @staticmethod
    def init_cluster_placement_groups(cluster: Any, config: Any) -> None:
        raise UnsupportedFeatureError(
            f"MegatronGeneration.init_cluster_placement_groups: not supported yet: {_STAND_ALONE}"
        )

    # Memory: the workers hold one model for training and sampling; nothing moves between the two.
    def prepare_for_generation(self, *args: Any, **kwargs: Any) -> None:
        pass

    def finish_generation(self, *args: Any, **kwargs: Any) -> None:
        pass

    # Refit: the workers sample with the weights they train.
    def prepare_refit_info(self, state_dict_info: Mapping[str, tuple[torch.Size, torch.dtype]]) -> None:
        pass

    def update_weights_from_state_dict(
        self, state_dict: Mapping[str, torch.Tensor] | PackedTensors | ray.ObjectRef
    ) -> None:
        pass

    def init_collective(  # type: ignore[override]  # NeMo-RL's signature
        self, ip: str, port: int, world_size: int, *, train_world_size: int, refit_backend: str = "gloo"
    ) -> list[ray.ObjectRef]:
        raise UnsupportedFeatureError(f"MegatronGeneration.init_collective: not supported yet: {_STAND_ALONE}")

    def update_weights_from_collective(self) -> list[ray.ObjectRef]:  # type: ignore[override]  # NeMo-RL's
        raise UnsupportedFeatureError(
            f"MegatronGeneration.update_weights_from_collective: not supported yet: {_STAND_ALONE}"
        )

    def preinit_nvshmem_collective(self) -> None:
        raise UnsupportedFeatureError(
            "MegatronGeneration.preinit_nvshmem_collective: not supported yet: NVSHMEM weight transfer"
        )

    def suspend_for_refit(self) -> None:
        pass  # nothing to suspend: sampling and training take turns in the same workers

    def resume_after_refit(self) -> None:
        pass

    def start_gpu_profiling(self) -> None:
        raise UnsupportedFeatureError("MegatronGeneration.start_gpu_profiling: not supported yet: Nsight GPU profiling")

    def stop_gpu_profiling(self) -> None:
        raise UnsupportedFeatureError("MegatronGeneration.stop_gpu_profiling: not supported yet: Nsight GPU profiling")

    def invalidate_kv_cache(self) -> None:
        pass  # no KV cache is kept between steps

    def shutdown(self) -> bool:
        return True  # the policy owns the workers and shuts them down
