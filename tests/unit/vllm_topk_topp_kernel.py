"""vLLM 0.32's Triton top-k/top-p kernel (``apply_top_k_top_p_triton``, the sampler's rule on CUDA) without vLLM.

The kernel's own source file is executed with its few vLLM imports replaced by small stand-ins (the launch helper
binds arguments by name, as vLLM's does), so the same kernel runs on a GPU machine that has triton but no vLLM, and
on CPU under ``TRITON_INTERPRET=1``. The source comes from ``.gpu_kit/vllm_topk_topp_triton.py`` (tools/gpu_kit.py
copies it there) or from the installed vLLM package.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import linecache
import os
import re
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

KIT_COPY = Path(__file__).resolve().parents[2] / ".gpu_kit" / "vllm_topk_topp_triton.py"
_IMPORTS = re.compile(r"^from vllm\..*?(?:\(.*?\)|$)", re.MULTILINE | re.DOTALL)


def kernel_source() -> Path | None:
    """Where the kernel's source file is, or None when neither the kit's copy nor vLLM is here."""
    if KIT_COPY.is_file():
        return KIT_COPY
    spec = importlib.util.find_spec("vllm")  # a top-level lookup: does not import vLLM
    if spec is None or not spec.submodule_search_locations:
        return None
    installed = Path(spec.submodule_search_locations[0]) / "v1" / "sample" / "ops" / "topk_topp_triton.py"
    return installed if installed.is_file() else None


def _dispatcher(kernel: Any, warmup_inputs: Any) -> Callable[[Callable[..., Any]], Callable[..., None]]:
    """Stand-in for vLLM's ``triton_kernel_dispatcher_with_warmup``: the decorated function returns (grid, keyword
    arguments); its own arguments fill the kernel's parameters of the same name in upper case, and a parameter
    ``X_STRIDE_d`` gets ``X.stride(d)``."""
    del warmup_inputs  # no warm-up: each launch compiles on first use

    def decorate(spec: Callable[..., Any]) -> Callable[..., None]:
        names = list(inspect.signature(spec).parameters)

        def launch(*args: Any, **kwargs: Any) -> None:
            given = {**dict(zip(names, args, strict=False)), **kwargs}
            grid, launch_kwargs = spec(**given)[:2]
            for name, value in given.items():
                if name.upper() in kernel.arg_names:
                    launch_kwargs.setdefault(name.upper(), value)
            for name in kernel.arg_names:
                base, _, dim = name.rpartition("_STRIDE_")
                if base and name not in launch_kwargs:
                    launch_kwargs[name] = launch_kwargs[base].stride(int(dim))
            kernel[grid](**launch_kwargs)

        return launch

    return decorate


def _num_compute_units(index: int | None = None) -> int:
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(index or 0).multi_processor_count
    return 1


def load_kernel() -> types.ModuleType:
    """The kernel module (``apply_top_k_top_p_triton(logits, k, p)``); import triton first with ``TRITON_INTERPRET=1``
    set to run it on CPU."""
    import triton
    import triton.language as tl

    path = kernel_source()
    if path is None:
        raise FileNotFoundError("no vLLM topk_topp_triton.py: install vllm or run tools/gpu_kit.py")
    source = _IMPORTS.sub("", path.read_text())
    if os.environ.get("TRITON_INTERPRET") == "1":
        # The interpreter's loop variables are Python ints, which have no .to(); plain ints index the same rows.
        source = re.sub(r"\b(row(?:_id)?)\.to\(tl\.int64\)", r"\1", source)
    module = types.ModuleType("vllm_topk_topp_triton")
    module.__dict__.update(
        triton=triton,
        tl=tl,
        triton_kernel_dispatcher_with_warmup=_dispatcher,
        DispatchSpec=Any,
        TritonWarmupTensor=lambda *args, **kwargs: None,
        WarmupChoices=lambda *args, **kwargs: None,
        WarmupIntRange=lambda *args, **kwargs: None,
        _when=lambda *args, **kwargs: None,
        current_platform=types.SimpleNamespace(is_cuda_alike=torch.cuda.is_available),
        gpu_sync_allowed=contextlib.nullcontext,
        next_power_of_2=lambda n: 1 << max(int(n) - 1, 0).bit_length(),
        num_compute_units=_num_compute_units,
    )
    # triton.jit reads each kernel's source back through linecache: register the edited text under its own name.
    filename = f"<vllm kernel from {path}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    exec(compile(source, filename, "exec"), module.__dict__)  # the kernel's own source, see above
    return module
