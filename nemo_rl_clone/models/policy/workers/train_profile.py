"""Where a policy's training time goes: forward, backward and optimizer time, padding, achieved FLOP/s and, on known
GPUs, the fraction of the device's peak (NeMo-RL's ``train_fp_utilization``).

Model FLOPs follow the usual convention: 6 × parameters × tokens per training pass (2 forward, 2 for the
activations' gradients, 2 for the weights' gradients), counted on the valid tokens only, so padding and recomputation
are overhead, not work. Frozen weights (LoRA) get no weight gradients: (4 × parameters + 2 × trainable) × tokens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import resource
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

# Dense peak FLOP/s (no sparsity) by device-name fragment: bf16/fp16 tensor cores; fp32 without TF32 (torch's
# default for matmuls). SXM parts.
_PEAK_FLOPS = {
    "H200": {torch.bfloat16: 989e12, torch.float16: 989e12, torch.float32: 67e12},
    "H100": {torch.bfloat16: 989e12, torch.float16: 989e12, torch.float32: 67e12},
    "A100": {torch.bfloat16: 312e12, torch.float16: 312e12, torch.float32: 19.5e12},
}


def device_peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """Peak FLOP/s of ``device`` in ``dtype``; None on CPU (measure it: benchmarks/matmul_ceiling.py) and on GPUs
    not in the table."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peaks.get(dtype) for fragment, peaks in _PEAK_FLOPS.items() if fragment in name), None)


@dataclass
class TrainProfile:
    """One rank's account of one ``train`` call."""

    forward_s: float = 0.0  # forward pass and loss
    backward_s: float = 0.0
    optimizer_s: float = 0.0  # gradient clipping and optimizer step
    valid_tokens: int = 0  # Σ input lengths of the microbatches
    computed_tokens: int = 0  # Σ rows × columns of the microbatches (padding included)
    num_parameters: int = 0  # of the whole model, not of this rank's shard
    trainable_parameters: int | None = None  # None: all of them
    peak_flops: float | None = None  # of this rank's device, when known
    num_workers: int = 1  # ranks merged into this profile
    peak_rss_bytes: int = 0  # the worker process's peak resident memory so far (the largest over merged ranks)

    @contextlib.contextmanager
    def timed(self, field: str, device: torch.device) -> Iterator[None]:
        """Add the block's wall time to ``field`` (CUDA work is waited for, so it lands in the right phase)."""
        start = time.perf_counter()
        yield
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        setattr(self, field, getattr(self, field) + time.perf_counter() - start)

    def count_microbatch(self, microbatch: Mapping[str, torch.Tensor], computed_tokens: int) -> None:
        """``computed_tokens``: what the model ran on (rows × columns, or the packed row's length)."""
        self.computed_tokens += computed_tokens
        lengths = microbatch.get("input_lengths")
        self.valid_tokens += int(lengths.sum()) if lengths is not None else microbatch["input_ids"].numel()


def merge(profiles: Sequence[TrainProfile]) -> TrainProfile:
    """Data-parallel ranks run side by side: the slowest rank's times, everyone's tokens."""
    slowest = max(profiles, key=lambda p: p.forward_s + p.backward_s + p.optimizer_s)
    return dataclasses.replace(
        slowest,
        valid_tokens=sum(p.valid_tokens for p in profiles),
        computed_tokens=sum(p.computed_tokens for p in profiles),
        num_workers=len(profiles),
        peak_rss_bytes=max(p.peak_rss_bytes for p in profiles),
    )


def profile_metrics(profile: TrainProfile, training_s: float) -> dict[str, dict[str, float]]:
    """``{"timing": ..., "performance": ...}`` metrics of one training phase that took ``training_s`` wall time: ``policy_forward``/``policy_backward``/``policy_optimizer`` seconds,
    ``train_padding_fraction``, ``train_gflops`` (model FLOP/s of the whole policy) and, on known GPUs,
    ``train_flops_per_gpu`` and ``train_fp_utilization``; ``policy_worker_peak_rss_gb`` (see `memory_metrics`)."""
    timing = {
        "policy_forward": profile.forward_s,
        "policy_backward": profile.backward_s,
        "policy_optimizer": profile.optimizer_s,
    }
    performance: dict[str, float] = {}
    if profile.computed_tokens:
        performance["train_padding_fraction"] = 1.0 - profile.valid_tokens / profile.computed_tokens
    if training_s > 0 and profile.num_parameters:
        trainable = profile.num_parameters if profile.trainable_parameters is None else profile.trainable_parameters
        flops_per_s = (4.0 * profile.num_parameters + 2.0 * trainable) * profile.valid_tokens / training_s
        performance["train_gflops"] = flops_per_s / 1e9
        if profile.peak_flops:
            performance["train_flops_per_gpu"] = flops_per_s / profile.num_workers
            performance["train_fp_utilization"] = flops_per_s / profile.num_workers / profile.peak_flops
    if profile.peak_rss_bytes:
        performance["policy_worker_peak_rss_gb"] = profile.peak_rss_bytes / 1e9
    return {"timing": timing, "performance": performance}


def peak_rss_bytes() -> int:
    """This process's peak resident memory since it started (``ru_maxrss``, kB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_metrics(performance: dict[str, float]) -> dict[str, float]:
    """Take the workers' peak-memory entries (``*_peak_rss_gb``) out of ``performance``: logged as ``memory/*``."""
    return {key: performance.pop(key) for key in [k for k in performance if k.endswith("_peak_rss_gb")]}
