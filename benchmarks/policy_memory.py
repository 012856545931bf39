"""Peak memory and training time of the DTensor policy worker on the main job's configuration, one knob at a time.

Each variant runs in a fresh child process holding one worker in-process (world size 1, the main job's
``policy`` section from ``configs/grpo_smollm2_cpu.yaml``, SmolLM2-135M in fp32 with its reference copy and AdamW):
the logprob pass, the reference-logprob pass and ``--steps`` training calls on a batch shaped like a main-job step
(32 samples, 38-token prompts, responses of 20–128 tokens: ~3,700 tokens). Reported per variant, in GB of resident
memory: after loading (weights + reference copy), the peak over the whole child (``ru_maxrss``), and the resident
size after the last step before and after ``malloc_trim(0)`` (what glibc keeps cached but no longer uses), and
``train_s``, the median wall time of the training calls after the first. Prints
``<variant>_peak_ratio=<variant peak / defaults peak>`` and ``<variant>_train_time_ratio=<variant / defaults>`` last
(the ``lora`` variant trains LoRA adapters of dim 8 on every linear layer and keeps no reference copy: the
reference is the base model with the adapters off).

    uv run --no-sync python benchmarks/policy_memory.py [--steps 2] [--variants defaults,full_logits,...]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {
    "defaults": [],
    "full_logits": ["policy.dtensor_cfg.logits_at_loss_tokens_only=false"],
    "padded": ["policy.sequence_packing.enabled=false"],
    "activation_checkpointing": ["policy.dtensor_cfg.activation_checkpointing=true"],
    "logprob_chunk_256": ["policy.logprob_chunk_size=256"],
    "lora": ["policy.dtensor_cfg.lora_cfg.enabled=true"],
}


def resident_gb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9


def child(variant: str, steps: int) -> dict[str, float]:
    import torch

    from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
    from nemo_rl_clone.algorithms.loss import NLLLossFn
    from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
    from nemo_rl_clone.models.huggingface import load_tokenizer, resolve_model_path
    from nemo_rl_clone.models.policy.dtensor.policy_worker import DTensorPolicyWorker
    from nemo_rl_clone.models.policy.workers import worker_setup
    from nemo_rl_clone.utils.config import load_validated_config

    worker_setup.set_single_process_env()
    config = load_validated_config(REPO / "configs" / "grpo_smollm2_cpu.yaml", VARIANTS[variant], GRPOMasterConfig)
    model_path = resolve_model_path(config.policy.model_name)
    tokenizer = load_tokenizer(model_path)
    worker = DTensorPolicyWorker(config.policy, tokenizer, model_path)
    loaded = resident_gb()

    generator = torch.Generator().manual_seed(0)
    prompt, responses = 38, torch.randint(20, 129, (32,), generator=generator)
    lengths = prompt + responses
    width = int(lengths.max())
    positions = torch.arange(width)
    valid = positions[None, :] < lengths[:, None]
    data = BatchedDataDict(
        input_ids=torch.randint(0, len(tokenizer), (32, width), generator=generator) * valid,
        input_lengths=lengths,
        token_mask=(valid & (positions[None, :] >= prompt)).float(),
        sample_mask=torch.ones(32),
    )
    worker.get_logprobs(data)
    worker.get_reference_policy_logprobs(data)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        worker.train(data, NLLLossFn())
        times.append(time.perf_counter() - start)
    after = resident_gb()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    trimmed = resident_gb()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB on Linux
    worker.shutdown()
    return {
        "after_load_gb": loaded,
        "peak_gb": peak,
        "after_steps_gb": after,
        "after_trim_gb": trimmed,
        "train_s": statistics.median(times[1:] or times),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2, help="training calls per variant")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, from {list(VARIANTS)}")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps)))
        return
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        sys.exit(f"--variants: unknown {unknown}; choose from {list(VARIANTS)}")
    results = {}
    for variant in variants:
        command = [sys.executable, __file__, "--child", variant, "--steps", str(args.steps)]
        proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"{variant}: failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        results[variant] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{variant:26s} " + " ".join(f"{key}={value:.2f}" for key, value in results[variant].items()))
    if "defaults" in results:
        for variant in variants:
            if variant != "defaults":
                print(f"{variant}_peak_ratio={results[variant]['peak_gb'] / results['defaults']['peak_gb']:.2f}")
                print(f"{variant}_train_time_ratio={results[variant]['train_s'] / results['defaults']['train_s']:.2f}")


if __name__ == "__main__":
    main()
