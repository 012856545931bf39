"""The time plan's probe (`nemo_rl_clone/models/machine_rates.py`) on this machine's first GPU, at the main job's
model shapes (SmolLM2-135M) in fp32 and bf16: each measured rate, and the training matmul rate beside the device's
published bf16 peak. Needs only torch (no vLLM: the decode GEMM is torch's). Part of tools/gpu_checks.sh.

    python3 tools/gpu_time_probe.py
"""

from __future__ import annotations

import dataclasses

import torch

from nemo_rl_clone.algorithms.run.time_plan import PUBLISHED_BF16_TFLOPS
from nemo_rl_clone.models import machine_rates
from nemo_rl_clone.models.memory_estimate import ModelShape

SMOLLM2 = ModelShape(
    num_parameters=134_515_008,
    num_layers=30,
    hidden_size=576,
    intermediate_size=1536,
    vocab_size=49152,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    tied_embeddings=True,
)


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this probe is for GPU machines (dry runs probe CPUs themselves)")
    name = torch.cuda.get_device_name(0)
    quick = machine_rates.quick_gflops()
    for precision in ("float32", "bfloat16"):
        rates = machine_rates.probe(SMOLLM2, precision, precision, 2048, 32, quick)
        print(precision, {k: round(v, 12) if isinstance(v, float) else v for k, v in dataclasses.asdict(rates).items()})
        peak = next((tflops for key, tflops in PUBLISHED_BF16_TFLOPS.items() if key in name), None)
        if peak and precision == "bfloat16":
            print(
                f"train matmuls {rates.train_gflops / 1e3:.1f} TFLOP/s = {rates.train_gflops / 1e3 / peak:.2f} of {name}'s published {peak}"
            )


if __name__ == "__main__":
    main()
