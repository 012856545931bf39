"""Methods vLLM mixes into its worker (``worker_extension_cls``): every refit loads through `load_weights_in_place`.

The async engine reaches its worker only through ``collective_rpc``, whose arguments cross the process boundary as
msgpack without type information: a tensor arrives as a plain list. Weights therefore travel as raw bytes with their
dtype and shape (`pack_for_engine_core`), and `WeightLoadExtension.load_packed_weights` rebuilds them next to the model.
The in-process engine passes tensors as they are.
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
    """Mixed into vLLM's worker class (it provides ``reload_weights`` and ``model_runner``)."""

    def load_packed_weights(self, rows: list[PackedWeight]) -> None:
        self.load_weights_in_place(unpack_in_engine_core(rows))

    def load_weights_in_place(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        worker: Any = self
        worker.reload_weights(weights_iterator=weights)
        prepack_cpu_experts_again(worker.model_runner.model)

    def prepare_pipeline_stage(self) -> bool:
        """Allocate the buffers a later pipeline stage receives activations into; True on such a stage.

        vLLM 0.32's CPU runner allocates them only in its warm-up, which it skips for an eager engine with a fixed
        KV-cache size: every forward of stage 2 and later would then fail."""
        from vllm.distributed import get_pp_group

        runner: Any = self.model_runner  # type: ignore[attr-defined]
        if get_pp_group().is_first_rank or runner.intermediate_tensors is not None:
            return False
        runner.intermediate_tensors = runner.model.make_empty_intermediate_tensors(
            batch_size=runner.max_num_tokens, dtype=runner.model_config.dtype, device=runner.device
        )
        return True

    def use_inverse_cdf_sampler(self) -> None:
        """Sample with `inverse_cdf_sampler.InverseCdfSampler` from the next step on."""
        from nemo_rl_clone.models.generation.vllm import inverse_cdf_sampler

        inverse_cdf_sampler.install(self.model_runner)  # type: ignore[attr-defined]

    def record_routing(self) -> int:
        """Start recording each token's routed experts (`routing_capture`); returns the number of MoE layers."""
        from nemo_rl_clone.models.generation.vllm.routing_capture import RoutingRecorder

        worker: Any = self
        worker.routing_recorder = RoutingRecorder(worker.model_runner)
        return int(worker.routing_recorder.num_layers)

    def take_routing(self, request_ids: list[str]) -> list[torch.Tensor]:
        worker: Any = self
        return list(worker.routing_recorder.take(request_ids))


def prepack_cpu_experts_again(model: torch.nn.Module) -> int:
    """Re-run the CPU experts kernel's weight prepacking on every MoE layer of ``model``; returns how many.

    vLLM 0.32's in-place reload re-runs an MoE layer's weight processing but, on a weight update, skips the experts
    kernel's own step (``fused_experts.process_weights_after_loading``). On CPU that step prepacks w13/w2 into the
    grouped-GEMM layout, so after a reload the kernel read raw weights as prepacked ones (logprobs off by up to 0.6 on
    a tiny Qwen3-MoE). GPU kernels need no such step; nothing else is touched."""
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    count = 0
    for name, module in model.named_modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if not isinstance(experts, CPUUnquantizedExperts):
            continue
        moe = experts.moe_config
        if experts._padded_intermediate_size(moe) != moe.intermediate_size_per_partition:
            # The first load padded the experts; the reload cannot have (it copies into the padded tensors).
            raise RuntimeError(
                f"{name}: the MoE intermediate size {moe.intermediate_size_per_partition} is not a multiple of "
                f"{experts._intermediate_alignment()}, which vLLM's CPU experts need for an in-place weight update"
            )
        experts.process_weights_after_loading(module)
        count += 1
    return count
