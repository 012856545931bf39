"""Refit time into an engine of several ranks vs into a one-rank engine, same model, same trainer.

A real `Policy` (1 FSDP2 worker, fp32) refits one vLLM engine per layout — colocated (the state dict through Ray's
object store) and collective (a gloo broadcast to the engine actor) — timed end to end by `refit_policy_generation`,
best of ``--repeats``. Every rank of an engine receives the full tensors and vLLM's loader keeps its shard. Layouts:
TP=1 and TP=2 on the built-in tiny Llama (4 heads split two ways), TP=1 and PP=2 on SmolLM2-135M (its 9 heads do
not split; its 30 layers do). Prints the times, then ``ratio=<sharded / one rank>`` per model and path.

    uv run --no-sync python benchmarks/refit_sharded.py [--repeats 3]
"""

from __future__ import annotations

import argparse

from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster, init_ray
from nemo_rl_clone.models.generation.config import GenerationConfig, VllmConfig
from nemo_rl_clone.models.generation.vllm import VllmGeneration
from nemo_rl_clone.models.huggingface import SMOLLM2, TINY_LLAMA, load_tokenizer, resolve_model_path
from nemo_rl_clone.models.policy.config import PolicyConfig
from nemo_rl_clone.models.policy.lm_policy import Policy
from nemo_rl_clone.rollout.refit import init_refit_collective, prepare_refit, refit_policy_generation

LAYOUTS = {TINY_LLAMA: ({}, {"tensor_parallel_size": 2}), SMOLLM2: ({}, {"pipeline_parallel_size": 2})}


def refit_times(model: str, layout: dict[str, int], repeats: int) -> dict[str, float]:
    """Best colocated and collective refit time of one engine of ``layout`` on 2 bundles."""
    model_path = resolve_model_path(model)
    vllm_cfg = VllmConfig(precision="float32", max_model_len=256, enforce_eager=True, kv_cache_memory_bytes=64 << 20)
    for key, value in layout.items():
        setattr(vllm_cfg, key, value)
    bundles = vllm_cfg.devices_per_engine
    shared = RayVirtualCluster([2], use_gpus=False, max_colocated_worker_groups=2, name="bench-sharded-shared")
    separate = RayVirtualCluster([bundles], use_gpus=False, name="bench-sharded-separate")
    engines, policy = [], None
    try:
        policy_config = PolicyConfig(
            model_name=model_path, precision="float32", train_global_batch_size=4, train_micro_batch_size=4
        )
        one_worker = RayVirtualCluster([1], use_gpus=False, max_colocated_worker_groups=2, name="bench-sharded-pol")
        policy = Policy(
            one_worker,
            policy_config,
            load_tokenizer(model_path),
            name_prefix="bench-sharded-policy",
            init_optimizer=False,
            init_reference_model=False,
        )
        config = GenerationConfig(vllm_cfg=vllm_cfg)
        colocated = VllmGeneration(shared, config, model_path, name_prefix="bench-sharded-colocated")
        collective = VllmGeneration(separate, config, model_path, name_prefix="bench-sharded-collective")
        engines = [colocated, collective]
        prepare_refit(policy, colocated)
        prepare_refit(policy, collective)
        init_refit_collective(policy, collective, one_worker)
        best = {}
        for mode, engine in (("colocated", colocated), ("collective", collective)):
            refit_policy_generation(policy, engine, colocated=mode == "colocated")  # warm-up
            best[mode] = min(
                refit_policy_generation(policy, engine, colocated=mode == "colocated") for _ in range(repeats)
            )
        return best
    finally:
        for component in (*engines, policy):
            if component is not None:
                component.shutdown()
        for cluster in (separate, shared):
            cluster.shutdown()
        if policy is not None:
            one_worker.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    init_ray(num_cpus=8)  # logical CPUs: the policy, two clusters of engines and their ranks time-share the cores
    for model, (single, sharded) in LAYOUTS.items():
        base, split = refit_times(model, single, args.repeats), refit_times(model, sharded, args.repeats)
        name = ", ".join(f"{k}={v}" for k, v in sharded.items())
        for mode in base:
            print(f"{model} {mode}: one rank {base[mode]:.3f} s, {name} {split[mode]:.3f} s")
            print(f"ratio={split[mode] / base[mode]:.2f} ({model} {mode})")


if __name__ == "__main__":
    main()
