"""The ceiling a CPU training step can reach: torch matmul GFLOP/s at SmolLM2-135M's shapes, fp32 and bf16, in this
process, beside the achieved model GFLOP/s a training run logged (``performance/train_gflops``).

Shapes (tokens T of one microbatch): the MLP's T × 576 × 1536, attention's T × 576 × 960 (q, k, v, o together)
and the 49,152-wide vocabulary projection T × 576 × 49152, each in the three layouts a training step runs
(forward X·Wᵀ, input gradient dY·W, weight gradient dYᵀ·X). Each figure is the best of ``--repeats`` timed runs
(least disturbed by other processes). Prints one line per shape and dtype, then ``bf16_over_fp32=<ratio>`` (the
FLOP-weighted speed-up bf16 offers on this CPU) and, with ``--metrics``, the training's achieved GFLOP/s as a
fraction of the fp32 and bf16 ceilings. Also says whether the CPU has native bf16 instructions.

    uv run --no-sync python benchmarks/matmul_ceiling.py [--tokens 2048] [--threads 2] [--metrics logs/.../metrics.jsonl]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from nemo_rl_clone.utils.platform import cpu_has_native_bf16

HIDDEN, MLP, ATTENTION, VOCAB = 576, 1536, 960, 49152


def best_gflops(a: torch.Tensor, b: torch.Tensor, repeats: int) -> float:
    a @ b  # warm-up: oneDNN picks and caches its kernel on the first call
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * a.shape[0] * a.shape[1] * b.shape[1] / min(times) / 1e9


def layouts(tokens: int, width: int, dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    x = torch.randn(tokens, HIDDEN, dtype=dtype)
    w = torch.randn(width, HIDDEN, dtype=dtype)
    dy = torch.randn(tokens, width, dtype=dtype)
    return {"forward": (x, w.t()), "input_grad": (dy, w), "weight_grad": (dy.t(), x)}


def achieved_gflops(metrics_file: Path) -> float | None:
    values = [
        row["performance/train_gflops"]
        for row in map(json.loads, metrics_file.read_text().splitlines())
        if "performance/train_gflops" in row
    ]
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048, help="tokens of one microbatch (train_mb_tokens)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--metrics", type=Path, help="a run's metrics.jsonl: its median performance/train_gflops")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"cpu native bf16 (avx512_bf16 / amx_bf16): {cpu_has_native_bf16()}; threads={args.threads}")
    weighted: dict[torch.dtype, float] = {}
    for dtype in (torch.float32, torch.bfloat16):
        total_flops = total_seconds = 0.0
        for name, width in (("mlp", MLP), ("attention", ATTENTION), ("vocab", VOCAB)):
            for layout, (a, b) in layouts(args.tokens, width, dtype).items():
                gflops = best_gflops(a, b, args.repeats)
                flops = 2 * a.shape[0] * a.shape[1] * b.shape[1]
                total_flops += flops
                total_seconds += flops / (gflops * 1e9)
                print(f"{dtype!s:15s} {name:9s} {layout:11s} {tuple(a.shape)}x{tuple(b.shape)}: {gflops:7.1f} GFLOP/s")
        weighted[dtype] = total_flops / total_seconds / 1e9
        print(f"{dtype!s:15s} all shapes (FLOP-weighted): {weighted[dtype]:.1f} GFLOP/s")
    if args.metrics is not None:
        achieved = achieved_gflops(args.metrics)
        if achieved is None:
            print(f"{args.metrics}: no performance/train_gflops rows")
        else:
            print(f"training achieved {achieved:.1f} GFLOP/s (median over steps)")
            print(f"of_fp32_ceiling={achieved / weighted[torch.float32]:.2f}")
            print(f"of_bf16_ceiling={achieved / weighted[torch.bfloat16]:.2f}")
    print(f"bf16_over_fp32={weighted[torch.bfloat16] / weighted[torch.float32]:.2f}")


if __name__ == "__main__":
    main()
