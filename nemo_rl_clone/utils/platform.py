"""Which torch build runs here, and a guard against the CPU build on a GPU machine.

The lock holds two torch builds: PyPI's CUDA build (default resolution, `gpu` group) and PyTorch's CPU build (`cpu`
group, the default on CPU machines). A GPU user who synced the default groups would train on CPU without noticing;
this guard makes that an error instead.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

ALLOW_CPU_TORCH_ENV = "NRL_ALLOW_CPU_TORCH_ON_GPU_MACHINE"


def nvidia_gpu_present() -> bool:
    """An NVIDIA driver is visible (device node or nvidia-smi), whatever torch build is installed."""
    return Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi") is not None


def torch_build_problem(torch_version: str, cuda_version: str | None, gpu_present: bool, allowed: bool) -> str | None:
    """The message to fail with, or None when the installed torch build fits this machine."""
    if not gpu_present or cuda_version is not None or allowed:
        return None
    return (
        f"torch {torch_version} is the CPU build but this machine has an NVIDIA GPU. Install the GPU environment: "
        "`UV_NO_DEFAULT_GROUPS=1 uv sync --locked --group dev --group gpu` (docs/install.md), "
        f"or set {ALLOW_CPU_TORCH_ENV}=1 to run on CPU on purpose."
    )


def check_torch_build() -> None:
    """Raise RuntimeError when the CPU torch build is about to run on a machine with an NVIDIA GPU."""
    import torch

    problem = torch_build_problem(
        torch.__version__, torch.version.cuda, nvidia_gpu_present(), os.environ.get(ALLOW_CPU_TORCH_ENV) == "1"
    )
    if problem:
        raise RuntimeError(problem)


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """The CPU executes bf16 matmuls natively (x86 ``avx512_bf16`` or ``amx_bf16`` flags in ``/proc/cpuinfo``); on
    other CPUs torch emulates bf16 and it is no faster than fp32. ``cpuinfo``: the file's text (read when None)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    return bool(flags & {"avx512_bf16", "amx_bf16"})
