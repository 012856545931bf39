"""What every policy worker does first, whatever its backend: join the process group and pick device and dtype."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

PRECISION_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def init_distributed() -> torch.device:
    """Join the process group described by ``RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT``; return this rank's device.

    CPU: gloo. GPU: NCCL for CUDA tensors plus gloo for the CPU tensors some collectives (object gathers) use.
    Ray gives each GPU actor its own ``CUDA_VISIBLE_DEVICES``, so the device is always ``cuda:0``.
    """
    if torch.cuda.is_available():
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
        backend = "cpu:gloo,cuda:nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    return device
