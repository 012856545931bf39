"""A stand-in trainer for refit tests that do not need the real `Policy`: a plain Hugging Face model in a Ray
actor whose weights are perturbed deterministically, exposing the refit methods a policy offers.

Workers import it as ``tests.unit.hf_weight_source``.
"""

from __future__ import annotations

from typing import Any

import ray
import torch
from transformers import AutoModelForCausalLM

from nemo_rl_clone.distributed.weight_transfer import (
    DEFAULT_BUCKET_BYTES,
    PackedTensors,
    WeightTransferGroup,
    broadcast_state_dict,
    pack_tensors,
    specs_from_state_dict,
)
from nemo_rl_clone.models.hf_export import to_checkpoint_layout
from tests.unit.weight_transfer_actors import FailingStateDict


def perturbed_model(model_path: str, seed: int, scale: float = 0.05) -> torch.nn.Module:
    """The model at ``model_path`` with ``scale``-sized Gaussian noise (seeded) added to every parameter; tied
    parameters stay tied (they are one parameter)."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(scale * torch.randn(param.shape, generator=generator))
    return model


def checkpoint_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a policy sends the engines: the state dict in the checkpoint layout (per-expert MoE weights)."""
    return to_checkpoint_layout(model, dict(model.state_dict()))


@ray.remote(num_cpus=0)
class HFWeightSource:
    """Train rank 0 stand-in holding ``perturbed_model(model_path, seed)``."""

    def __init__(self, model_path: str, seed: int) -> None:
        self.model_path = model_path
        self.state = checkpoint_state(perturbed_model(model_path, seed))
        self.group: WeightTransferGroup | None = None
        self.fail_on: str | None = None

    def set_seed(self, seed: int) -> None:
        self.state = checkpoint_state(perturbed_model(self.model_path, seed))

    def set_fail_on(self, name: str | None) -> None:
        self.fail_on = name

    def prepare_refit_info(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        return {name: (tensor.shape, tensor.dtype) for name, tensor in self.state.items()}

    def get_full_state_dict(self) -> dict[str, torch.Tensor]:
        return self.state

    def get_packed_state_dict(self) -> PackedTensors:
        return pack_tensors(self.state)

    def init_collective(self, address: str, port: int, world_size: int, timeout_s: float) -> None:
        self.group = WeightTransferGroup(address, port, 0, world_size, timeout_s=timeout_s)

    def broadcast(self, bucket_bytes: int) -> int:
        assert self.group is not None
        if self.fail_on is None:
            return broadcast_state_dict(self.group, self.state, bucket_bytes)
        lazy = FailingStateDict(self.state, self.fail_on)
        return broadcast_state_dict(self.group, lazy, bucket_bytes, specs_from_state_dict(self.state))


class HFPolicyStandIn:
    """Driver-side facade over one `HFWeightSource`, with the refit methods `refit_policy_generation` calls."""

    def __init__(self, model_path: str, seed: int) -> None:
        self.actor = HFWeightSource.remote(model_path, seed)

    def prepare_refit_info(self) -> dict[str, Any]:
        return ray.get(self.actor.prepare_refit_info.remote())

    def offload_before_refit(self) -> None:
        """Nothing to free: the stand-in lives in CPU memory."""

    def offload_after_refit(self) -> None:
        """Nothing to free: the stand-in lives in CPU memory."""

    def get_full_state_dict_for_refit(self) -> dict[str, torch.Tensor]:
        return ray.get(self.actor.get_full_state_dict.remote())

    def get_packed_state_dict_ref_for_refit(self) -> ray.ObjectRef:
        ref = self.actor.get_packed_state_dict.remote()
        ray.wait([ref])
        return ref

    def init_collective(self, address: str, port: int, world_size: int, timeout_s: float = 60.0) -> list[ray.ObjectRef]:
        return [self.actor.init_collective.remote(address, port, world_size, timeout_s)]

    def broadcast_weights_for_collective(self, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[ray.ObjectRef]:
        return [self.actor.broadcast.remote(bucket_bytes)]

    def shutdown(self) -> None:
        ray.kill(self.actor)
