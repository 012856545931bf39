"""Pack what the GPU checks need on a machine that has Python 3.12, torch and transformers but no Ray, no uv
environment and no network: ``.gpu_kit/`` (git-ignored, ~3.5 MB) with

- ``wheels/``: the project's pure-import dependencies that such a machine lacks (omegaconf, antlr4-python3-runtime,
  megatron-core), at the versions of this checkout's environment, for CPython 3.12 on manylinux x86-64;
- ``cache/``: the built-in tokenizer (``NRL_CACHE_DIR``), from which the tiny test models are built there;
- ``vllm_topk_topp_triton.py``: vLLM's top-k/top-p Triton kernel source, for the tie-rule check.

Then on the GPU machine, from the repository root with ``.gpu_kit`` beside it: ``bash tools/gpu_checks.sh OUT_DIR``
(docs/gpu.md). Run here:

    uv run --no-sync python tools/gpu_kit.py [--python-version 3.12]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KIT = REPO / ".gpu_kit"
PACKAGES = ("omegaconf", "antlr4-python3-runtime", "megatron-core")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def download_wheels(python_version: str) -> None:
    wheels = KIT / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in PACKAGES]
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    # uv environments carry no pip: uvx runs pip itself (fetched from PyPI once).
    command = ["uvx", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", python_version, "--implementation", "cp", *platforms, "-d", str(wheels), *pins]
    if subprocess.run(command).returncode != 0:
        sys.exit(f"error: pip could not download {' '.join(pins)} for Python {python_version} (needs PyPI access)")


def pack_tokenizer() -> None:
    cache = KIT / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    os.environ["NRL_CACHE_DIR"] = str(cache)
    from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer

    load_tokenizer(TINY_LLAMA)  # built-in names cache the shared tokenizer only, not a model


def copy_sampler_kernel() -> None:
    """vLLM's top-k/top-p Triton kernel source (the GPU machine has triton but no vLLM): the `gpu` test that checks
    the trainer's "lowest_index" tie rule against it loads this copy."""
    spec = importlib.util.find_spec("vllm")  # a top-level lookup: does not import vLLM
    locations = spec.submodule_search_locations if spec is not None else None
    source = Path(locations[0]) / "v1" / "sample" / "ops" / "topk_topp_triton.py" if locations else None
    if source is None or not source.is_file():
        sys.exit("error: vllm's v1/sample/ops/topk_topp_triton.py is not installed here (uv sync installs it)")
    shutil.copyfile(source, KIT / "vllm_topk_topp_triton.py")  # the name tests/unit/vllm_topk_topp_kernel.py reads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python")
    args = parser.parse_args()
    download_wheels(args.python_version)
    pack_tokenizer()
    copy_sampler_kernel()
    size = sum(path.stat().st_size for path in KIT.rglob("*") if path.is_file())
    print(f"{KIT.relative_to(REPO)}: {size / 1e6:.1f} MB ({', '.join(sorted(p.name for p in KIT.glob('wheels/*')))})")


if __name__ == "__main__":
    main()
