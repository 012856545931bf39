"""Ray actors for tests/unit/test_weight_transfer.py (workers import them as ``tests.unit.weight_transfer_actors``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import ray
import torch

from nemo_rl_clone.distributed.weight_transfer import (
    WeightTransferGroup,
    broadcast_state_dict,
    receive_state_dict,
    specs_from_state_dict,
)

GROUP_TIMEOUT_S = 30.0


def make_state_dict() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "layer.0.weight": torch.randn(64, 33, generator=generator),
        "layer.0.bias": torch.randn(33, generator=generator).to(torch.bfloat16),
        "layer.1.weight": torch.randn(128, 128, generator=generator),  # 64 KiB: alone in its bucket below
        "counts": torch.arange(-5, 7, dtype=torch.int64).reshape(3, 4),
        "mask": torch.rand(17, generator=generator) > 0.5,
        "scale": torch.tensor(3.25),
        "empty": torch.zeros(0, 4),
    }


class FailingStateDict(Mapping[str, torch.Tensor]):
    """A state dict that produces tensors on access, as a sharded trainer gathering them would; one fails."""

    def __init__(self, state: dict[str, torch.Tensor], failing: str) -> None:
        self.state, self.failing = state, failing

    def __getitem__(self, name: str) -> torch.Tensor:
        if name == self.failing:
            raise RuntimeError(f"could not gather {name}")
        return self.state[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.state)

    def __len__(self) -> int:
        return len(self.state)


@ray.remote(num_cpus=0)
class TransferMember:
    def join(self, port: int, rank: int, world_size: int) -> None:
        self.group = WeightTransferGroup("127.0.0.1", port, rank, world_size, timeout_s=GROUP_TIMEOUT_S)

    def send(self, bucket_bytes: int, failing: str | None = None, drop: str | None = None) -> int:
        state = make_state_dict()
        if drop:
            del state[drop]
        if failing is None:
            return broadcast_state_dict(self.group, state, bucket_bytes)
        return broadcast_state_dict(
            self.group, FailingStateDict(state, failing), bucket_bytes, specs_from_state_dict(state)
        )

    def receive(self, bucket_bytes: int) -> dict[str, torch.Tensor]:
        return receive_state_dict(
            self.group, specs_from_state_dict(make_state_dict()), src=0, bucket_bytes=bucket_bytes
        )
