"""Runtime patches that let megatron-core 0.16.1 run on CPU over gloo (see this package's README for the list).

Usage, in every process that builds a Megatron model, after ``import megatron.core`` and before
``tensor_parallel.model_parallel_cuda_manual_seed``::

    import megatron_cpu_shims
    megatron_cpu_shims.apply()
    ...
    with megatron_cpu_shims.cuda_redirect():
        model = DistributedDataParallel(...)
        optimizer = get_megatron_optimizer(...)

Both are no-ops when CUDA is available.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

MEGATRON_CORE_VERSION = "0.16.1"

_applied = False


def cpu_only() -> bool:
    return not torch.cuda.is_available()


def apply() -> None:
    """Install shims 1-3, 5 and 6 in this process (idempotent). Raises if megatron-core is another release."""
    global _applied
    if _applied or not cpu_only():
        return
    from megatron.core import package_info

    if package_info.__version__ != MEGATRON_CORE_VERSION:
        raise RuntimeError(
            f"megatron_cpu_shims patches megatron-core {MEGATRON_CORE_VERSION}, found {package_info.__version__}; "
            "re-check the shims against that release before using it on CPU"
        )
    _install_rng_tracker()
    torch.cuda.current_device = _cpu_device  # type: ignore[assignment]
    torch.cuda.synchronize = _no_op  # type: ignore[assignment]
    _install_cpu_causal_mask()
    _install_cpu_schedule_counters()
    _applied = True


def _cpu_device() -> str:
    return "cpu"


def _no_op(*args: Any, **kwargs: Any) -> None:
    return None


# --------------------------------------------------------------------------- 1. RNG tracker
def _install_rng_tracker() -> None:
    from megatron.core.tensor_parallel import random as mrandom

    class CpuRNGStatesTracker(mrandom.CudaRNGStatesTracker):
        """Named RNG states of the CPU generator (upstream keeps CUDA generator states)."""

        def add(self, name: str, seed: int) -> None:
            self._is_initialized = True
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            self.seeds_.add(seed)
            original = torch.get_rng_state()
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(original)

        @contextlib.contextmanager
        def fork(self, name: str = mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME) -> Iterator[None]:
            if name not in self.states_:
                raise Exception(f"rng state {name} is not added")
            original = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(original)

    upstream_initialize = mrandom.initialize_rng_tracker

    def initialize_rng_tracker(*args: Any, **kwargs: Any) -> None:
        upstream_initialize(*args, **kwargs)
        if not isinstance(mrandom._CUDA_RNG_STATE_TRACKER, CpuRNGStatesTracker):
            mrandom._CUDA_RNG_STATE_TRACKER = CpuRNGStatesTracker()
            mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True

    mrandom.initialize_rng_tracker = initialize_rng_tracker
    mrandom.CpuRNGStatesTracker = CpuRNGStatesTracker  # type: ignore[attr-defined]

    # Activation recomputation (`tensor_parallel.checkpoint`) saves and restores the "CUDA" RNG state around the
    # recomputed forward through these two; the CPU generator is the device generator here.
    def get_device_rng_state(*args: Any, clone: bool = False, **kwargs: Any) -> torch.Tensor:
        return torch.get_rng_state()

    def set_device_rng_state(new_state: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        torch.set_rng_state(new_state)

    mrandom._get_cuda_rng_state = get_device_rng_state
    mrandom._set_cuda_rng_state = set_device_rng_state


# --------------------------------------------------------------------------- 3. causal mask
def _install_cpu_causal_mask() -> None:
    from megatron.core.fusions import fused_softmax
    from megatron.core.transformer import utils

    def get_default_causal_mask(sq: int) -> torch.Tensor:
        return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)

    utils.get_default_causal_mask = get_default_causal_mask
    fused_softmax.get_default_causal_mask = get_default_causal_mask


# --------------------------------------------------------------------------- 6. schedule token counters
class _CpuFactoryTorch(types.ModuleType):
    """``torch`` as the pipeline schedules see it: the same module, except that ``zeros`` allocates on CPU.

    The schedules' only CUDA call is ``torch.zeros([], dtype=torch.int, device="cuda")`` (the token counter);
    redirecting just that keeps `cuda_redirect`'s per-op Python dispatch out of every forward and backward."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def zeros(*args: Any, **kwargs: Any) -> torch.Tensor:
        if "device" in kwargs:
            kwargs["device"] = _to_cpu_device(kwargs["device"])
        return torch.zeros(*args, **kwargs)


def _install_cpu_schedule_counters() -> None:
    from megatron.core.pipeline_parallel import schedules

    schedules.torch = _CpuFactoryTorch("torch")  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- 4. device redirection
_CUDA_TYPE_NAMES = {
    torch.float32: "torch.cuda.FloatTensor",
    torch.float16: "torch.cuda.HalfTensor",
    torch.bfloat16: "torch.cuda.BFloat16Tensor",
    torch.float64: "torch.cuda.DoubleTensor",
    torch.int64: "torch.cuda.LongTensor",
    torch.int32: "torch.cuda.IntTensor",
    torch.uint8: "torch.cuda.ByteTensor",
    torch.bool: "torch.cuda.BoolTensor",
}


def _to_cpu_device(value: Any) -> Any:
    if isinstance(value, torch.device) and value.type == "cuda":
        return torch.device("cpu")
    if isinstance(value, str) and value.startswith("cuda"):
        return "cpu"
    if isinstance(value, int) and not isinstance(value, bool):
        return "cpu"  # a bare device index means a CUDA device
    return value


class _CudaToCpu(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            tensor = args[0]
            return _CUDA_TYPE_NAMES.get(tensor.dtype, func(*args))
        if "device" in kwargs:
            kwargs["device"] = _to_cpu_device(kwargs["device"])
        if func is torch.Tensor.to and len(args) > 1:
            args = (args[0], _to_cpu_device(args[1]) if not isinstance(args[1], torch.dtype) else args[1], *args[2:])
        return func(*args, **kwargs)


@contextlib.contextmanager
def cuda_redirect() -> Iterator[None]:
    """While inside: CUDA device requests land on CPU, ``.cuda()`` is a no-op and ``Tensor.type()`` reports the
    ``torch.cuda.*`` name Megatron's optimizer asserts. A no-op when CUDA is available."""
    if not cpu_only():
        yield
        return
    with _CudaToCpu():
        yield
