"""The guard against running PyTorch's CPU build on a GPU machine (docs/install.md: CPU vs GPU)."""

import pytest
import torch

from nemo_rl_clone.utils.platform import (
    ALLOW_CPU_TORCH_ENV,
    check_torch_build,
    cpu_has_native_bf16,
    nvidia_gpu_present,
    torch_build_problem,
)


def test_cpu_build_on_gpu_machine_is_an_error_with_the_fix():
    msg = torch_build_problem("2.13.0+cpu", None, gpu_present=True, allowed=False)
    assert "CPU build but this machine has an NVIDIA GPU" in msg
    assert "--group gpu" in msg and ALLOW_CPU_TORCH_ENV in msg


@pytest.mark.parametrize(
    "cuda, gpu, allowed", [("13.0", True, False), (None, False, False), (None, True, True), ("13.0", False, False)]
)
def test_fitting_builds_pass(cuda, gpu, allowed):
    assert torch_build_problem("2.13.0", cuda, gpu_present=gpu, allowed=allowed) is None


def test_this_machine_passes_the_guard():
    # CPU machines: no GPU, CPU build. A GPU machine with the default (cpu) groups synced fails here, as intended.
    if torch.version.cuda is None and nvidia_gpu_present():
        with pytest.raises(RuntimeError, match="CPU build"):
            check_torch_build()
    else:
        check_torch_build()


@pytest.mark.parametrize(
    ("flags", "native"),
    [
        ("fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni", True),
        ("fpu sse2 avx2 amx_bf16 amx_tile", True),
        ("fpu sse2 avx2 avx512f avx512_vnni", False),  # AVX-512 without bf16: torch emulates bf16
    ],
)
def test_native_bf16_is_read_from_the_cpu_flags(flags, native):
    cpuinfo = f"processor\t: 0\nmodel name\t: some cpu\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n"
    assert cpu_has_native_bf16(cpuinfo) is native
