"""Methods vLLM mixes into its worker of the async engine's core process (``worker_extension_cls``).

The async engine reaches its worker only through ``collective_rpc``, whose arguments cross the process boundary as
msgpack without type information: a tensor arrives as a plain list. Weights therefore travel as raw bytes with their
dtype and shape (`pack_for_engine_core`), and `WeightLoadExtension.load_packed_weights` rebuilds them next to the model.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from tqdm import tqdm

EXTENSION = f"{__name__}.WeightLoadExtension"

# This module is imported in the engine core's worker process, before the model loads. Every tqdm bar (vLLM's
# loading bars, even disabled ones) takes tqdm's shared lock, by default a named multiprocessing semaphore in
# /dev/shm that only the process's exit removes; a worker killed on Ctrl-C (async_engine.ENGINE_CORE_EXIT_S) would
# leave it behind. A thread lock serves the one process as well.
tqdm.set_lock(threading.RLock())
PackedWeight = tuple[str, str, list[int], bytes]  # name, dtype name, shape, raw bytes


def pack_for_engine_core(state: Mapping[str, torch.Tensor]) -> list[PackedWeight]:
    """``state`` as `PackedWeight` rows (one copy of each tensor's bytes)."""
    rows = []
    for name, tensor in state.items():
        flat = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        rows.append((name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), flat.numpy().tobytes()))
    return rows


def unpack_in_engine_core(rows: Iterable[PackedWeight]) -> list[tuple[str, torch.Tensor]]:
    """The tensors of `pack_for_engine_core` rows, as ``reload_weights`` takes them."""
    tensors = []
    for name, dtype, shape, data in rows:
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        tensors.append((name, raw.view(getattr(torch, dtype)).reshape(shape)))
    return tensors


class WeightLoadExtension:
    """Mixed into vLLM's worker class (it provides ``reload_weights``)."""

    def load_packed_weights(self, rows: list[PackedWeight]) -> None:
        worker: Any = self
        worker.reload_weights(weights_iterator=unpack_in_engine_core(rows))
