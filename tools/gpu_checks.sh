#!/bin/bash
# The GPU checks, on a machine with Python 3, torch (CUDA) and transformers but no Ray and no uv environment:
# the worker-level `gpu` tests (DTensor and Megatron Core on CUDA, bf16 against fp32), vLLM's top-k/top-p kernel
# against the trainer's "lowest_index" tie rule, a vLLM engine of tensor_parallel_size 2 refit over NCCL (needs two
# GPUs, Ray and vLLM: it skips and says which is missing otherwise), the kernel's tie counts, the time plan's probe
# (measured rates beside the published peak), and the ~0.5B training
# throughput / MFU benchmark. Needs `.gpu_kit/` (made by tools/gpu_kit.py) in the repository root.
#   bash tools/gpu_checks.sh OUT_DIR [extra benchmark arguments]
# Writes OUT_DIR/{env.txt,gpu_tests.log,tp2_engine.log,kernel_ties.json,kernel_ties.log,time_probe.log,train_mfu.log}; exits
# non-zero if a test, the tie count or the benchmark failed. About 6 minutes on an H200.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash tools/gpu_checks.sh OUT_DIR [benchmark arguments]}
shift
mkdir -p "$out"
[ -d .gpu_kit/wheels ] || { echo "error: .gpu_kit/wheels missing: run tools/gpu_kit.py first" >&2; exit 2; }

site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .gpu_kit/wheels/*.whl || exit 2
export PYTHONPATH="$site:$PWD:$PWD/3rdparty/megatron-cpu-shims" NRL_CACHE_DIR="$PWD/.gpu_kit/cache" PYTHONUNBUFFERED=1

{
  date -u +%Y-%m-%dT%H:%MZ
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__)"
} >"$out/env.txt" 2>&1
cat "$out/env.txt"

status=0
python3 -m pytest -m gpu -v -p no:cacheprovider -o addopts="" \
  tests/unit/test_dtensor_worker_cuda.py tests/unit/test_megatron_policy.py tests/unit/test_logger.py \
  tests/unit/test_logits_sampling_utils.py \
  2>&1 | tee "$out/gpu_tests.log" || status=1
# pytest's 5: the module skipped itself at collection (fewer than two GPUs, or no Ray / vLLM); the reason is logged.
python3 -m pytest -v -rs -p no:cacheprovider -o addopts="" tests/unit/test_vllm_engine_tp2_gpu.py \
  2>&1 | tee "$out/tp2_engine.log"
case ${PIPESTATUS[0]} in 0 | 5) ;; *) status=1 ;; esac
# Not a pass/fail check: how the CUDA kernel keeps ties at the boundary, row counts per rule (docs/gpu.md).
python3 tools/gpu_kernel_ties.py "$out/kernel_ties.json" 2>&1 | tee "$out/kernel_ties.log" || status=1
python3 tools/gpu_time_probe.py 2>&1 | tee "$out/time_probe.log" || status=1
python3 benchmarks/train_mfu.py "$@" 2>&1 | tee "$out/train_mfu.log" || status=1
exit $status
