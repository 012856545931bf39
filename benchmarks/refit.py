"""Refit (weight sync) time of SmolLM2-135M-Instruct, colocated and collective, vs one GRPO-sized generation batch.

A real `Policy` (1 FSDP2 worker, fp32) shares its bundle with one vLLM engine (colocated: the state dict goes
through Ray's object store) and broadcasts to a second engine on its own bundle (collective: gloo, 256 MiB
buckets). Each refit is timed end to end by `refit_policy_generation` (gather on the trainer, transfer, checks,
load, prefix-cache reset); the best of ``--repeats`` counts. The generation batch is ``--prompts`` x
``--generations`` samples of ``--max-new-tokens`` on the colocated engine (default 16 x 4 x 128: the CPU-scale GRPO
step of this project). Prints raw numbers, then ``ratio=<slower refit / generation batch>`` last (target <= 0.05).

    uv run --no-sync python benchmarks/refit.py [--repeats 3] [--prompts 16] [--generations 4] [--max-new-tokens 128]
"""

from __future__ import annotations

import argparse
import time

import torch

from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster, init_ray
from nemo_rl_clone.models.generation.config import GenerationConfig, VllmConfig
from nemo_rl_clone.models.generation.vllm import VllmGeneration
from nemo_rl_clone.models.huggingface import SMOLLM2, load_tokenizer, resolve_model_path
from nemo_rl_clone.models.policy.config import PolicyConfig
from nemo_rl_clone.models.policy.lm_policy import Policy
from nemo_rl_clone.rollout.refit import init_refit_collective, prepare_refit, refit_policy_generation


def make_policy(cluster: RayVirtualCluster, model_path: str, tokenizer) -> Policy:
    config = PolicyConfig(
        model_name=model_path, precision="float32", train_global_batch_size=4, train_micro_batch_size=4
    )
    kwargs = {"name_prefix": "bench-policy", "init_optimizer": False, "init_reference_model": False}
    if hasattr(Policy, "broadcast_weights_for_collective") and hasattr(Policy, "get_packed_state_dict_ref_for_refit"):
        return Policy(cluster, config, tokenizer, **kwargs)
    # TEMPORARY until the policy gains the collective-refit wrappers (see tests/functional/refit_policy_shim.py).
    from tests.functional.refit_policy_shim import make_policy as make_shim_policy

    return make_shim_policy(cluster, config, tokenizer, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()

    model_path = resolve_model_path(SMOLLM2)
    tokenizer = load_tokenizer(model_path)
    tokenizer.padding_side = "right"
    config = GenerationConfig(
        max_new_tokens=args.max_new_tokens,
        vllm_cfg=VllmConfig(
            precision="float32", max_model_len=512, enforce_eager=True, kv_cache_memory_bytes=256 << 20
        ),
    )
    texts = [f"Question {i}: what is {i} + {2 * i + 1}? Think step by step." for i in range(args.prompts)]
    encoded = tokenizer(texts, padding=True, return_tensors="pt")
    batch = BatchedDataDict(input_ids=encoded["input_ids"], input_lengths=encoded["attention_mask"].sum(dim=1))
    batch = batch.repeat_interleave(args.generations)
    batch["seeds"] = torch.arange(batch.size)

    init_ray()
    shared = RayVirtualCluster([1], use_gpus=False, max_colocated_worker_groups=2, name="bench-refit-shared")
    separate = RayVirtualCluster([1], use_gpus=False, name="bench-refit-separate")
    policy = colocated = collective = None
    try:
        policy = make_policy(shared, model_path, tokenizer)
        colocated = VllmGeneration(shared, config, model_path, name_prefix="bench-vllm-colocated")
        collective = VllmGeneration(separate, config, model_path, name_prefix="bench-vllm-collective")
        prepare_refit(policy, colocated)
        prepare_refit(policy, collective)
        init_refit_collective(policy, collective, shared)
        refit_policy_generation(policy, colocated, colocated=True)  # warm-up of both paths
        refit_policy_generation(policy, collective, colocated=False)

        times = {"colocated": [], "collective": []}
        for _ in range(args.repeats):
            times["colocated"].append(refit_policy_generation(policy, colocated, colocated=True))
            times["collective"].append(refit_policy_generation(policy, collective, colocated=False))
        start = time.perf_counter()
        out = colocated.generate(batch)
        generation_s = time.perf_counter() - start
        tokens = int(out["generation_lengths"].sum())
    finally:
        for component in (collective, colocated, policy):
            if component is not None:
                component.shutdown()
        separate.shutdown()
        shared.shutdown()

    for mode, values in times.items():
        print(f"refit {mode}: " + ", ".join(f"{v:.3f}" for v in values) + f" s (best {min(values):.3f} s)")
    print(
        f"generation batch: {batch.size} samples, {tokens} tokens in {generation_s:.2f} s "
        f"({tokens / generation_s:.1f} tok/s)"
    )
    slower = max(min(values) for values in times.values())
    print(f"ratio={slower / generation_s:.4f}")


if __name__ == "__main__":
    main()
