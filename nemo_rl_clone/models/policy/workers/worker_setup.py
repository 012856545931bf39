"""What every policy worker does first, whatever its backend: join the process group and pick device and dtype."""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket

import torch
import torch.distributed as dist

from nemo_rl_clone.distributed.worker_placement import collective_timeout
from nemo_rl_clone.utils.platform import cpu_has_native_bf16

PRECISION_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def free_local_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for a process group's ``MASTER_PORT``)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def set_single_process_env() -> None:
    """Describe this process as rank 0 of a world of 1 on a free local port, for `init_distributed` (a worker run
    in-process by an export or a benchmark rather than started by `Policy`)."""
    port = free_local_port()
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def init_distributed() -> torch.device:
    """Join the process group described by ``RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT``; return this rank's device.

    CPU: gloo. GPU: NCCL for CUDA tensors plus gloo for the CPU tensors some collectives (object gathers) use.
    Every group's timeout is the cluster's collective timeout when it has one (`collective_timeout`).
    Ray gives each GPU actor its own ``CUDA_VISIBLE_DEVICES``, so the device is always ``cuda:0``.
    """
    if torch.cuda.is_available():
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
        backend = "cpu:gloo,cuda:nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    timeout = collective_timeout()
    if timeout is not None:
        # Groups torch makes without a timeout of their own (a DeviceMesh's sub-groups) take these defaults.
        dist.distributed_c10d.default_pg_timeout = timeout
        dist.distributed_c10d.default_pg_nccl_timeout = timeout
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout
        )
    return device


def backward_dtype(compute_dtype: torch.dtype, backward_precision: str, device: torch.device) -> torch.dtype:
    """The dtype of the backward's matmuls for ``policy.dtensor_cfg.backward_precision`` (see its comment): bf16
    only for an fp32 policy, and with "auto" only where the device runs bf16 natively."""
    if compute_dtype != torch.float32 or backward_precision == "float32":
        return compute_dtype
    if backward_precision == "bfloat16" or device.type == "cuda" or cpu_has_native_bf16():
        return torch.bfloat16
    return torch.float32


def clear_cache_due(optimizer_steps: int, every_n_steps: int | None) -> bool:
    """Whether ``policy.dtensor_cfg.clear_cache_every_n_steps`` empties the CUDA cache after optimizer step number
    ``optimizer_steps`` (1-based): every n-th step; never with null."""
    return every_n_steps is not None and optimizer_steps % every_n_steps == 0


def release_freed_memory(device: torch.device) -> None:
    """Give memory that the step freed back to the system: CUDA's caching allocator on GPU; on CPU, glibc's heap,
    which keeps a training step's freed activations (~1.2 GB for the main job's SmolLM2 step) mapped otherwise —
    resident memory a colocated engine and the rest of the machine could use."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        return
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim this way
        ctypes.CDLL("libc.so.6").malloc_trim(0)
