"""The trainer side of weight sync, shared by every policy worker: rank 0 hands the full Hugging Face-named state
dict to the generation engines, through Ray's object store (colocated) or a broadcast group (collective)."""

from __future__ import annotations

import torch

from nemo_rl_clone.distributed.weight_transfer import (
    DEFAULT_BUCKET_BYTES,
    DEFAULT_TIMEOUT_S,
    PackedTensors,
    WeightTransferGroup,
    broadcast_state_dict,
    pack_tensors,
)


class RefitSender:
    """Mixin for a policy worker with ``rank``, ``device`` and ``get_full_state_dict_for_refit()`` (a collective
    returning the state dict on rank 0 and None elsewhere)."""

    rank: int
    device: torch.device
    transfer_group: WeightTransferGroup

    def get_full_state_dict_for_refit(self) -> dict[str, torch.Tensor] | None:
        raise NotImplementedError

    def get_packed_state_dict_for_refit(self) -> PackedTensors | None:
        """`get_full_state_dict_for_refit` packed into one buffer (engines read it from Ray's shared memory)."""
        state = self.get_full_state_dict_for_refit()
        return pack_tensors(state) if state is not None else None

    def init_collective(
        self, master_address: str, master_port: int, world_size: int, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        """Rank 0 joins the weight-transfer group with the engines (member 0); other ranks only gather for it."""
        if self.rank == 0:
            self.transfer_group = WeightTransferGroup(
                master_address, master_port, 0, world_size, self.device, timeout_s
            )

    def broadcast_weights_for_collective(self, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        """Gather the full weights (a collective over all ranks) and broadcast them from rank 0 in buckets."""
        state = self.get_full_state_dict_for_refit()
        if state is not None:
            broadcast_state_dict(self.transfer_group, state, bucket_bytes)
