"""`Policy.get_topk_logits` (2 DTensor workers on a local Ray cluster) against a plain single-process Hugging Face
forward of the same model, in fp32: values to 1e-5 absolute, identical indices."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer, resolve_model_path
from nemo_rl_clone.models.policy.config import DynamicBatchingConfig
from nemo_rl_clone.models.policy.interfaces import TopkLogitsOutputSpec
from nemo_rl_clone.models.policy.lm_policy import Policy
from nemo_rl_clone.models.policy.workers.topk_logits import topk_of_logits
from tests.unit.policy_reference import make_batch, policy_config

K = 5


@pytest.fixture(scope="module")
def model_path() -> str:
    return resolve_model_path(TINY_LLAMA)


@pytest.fixture(scope="module")
def batch(model_path: str) -> BatchedDataDict:
    return make_batch(load_tokenizer(model_path))


@pytest.fixture(scope="module")
def hf_topk(model_path: str, batch: BatchedDataDict) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of the plain HF logits (one forward of the padded batch; right padding needs no attention mask)."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"]).logits
    values, indices = logits.topk(K, dim=-1)
    valid = (torch.arange(logits.shape[1])[None, :] < batch["input_lengths"][:, None]).unsqueeze(-1)
    return torch.where(valid, values, 0.0), torch.where(valid, indices, 0)


@pytest.fixture(scope="module")
def results(ray_local: None, model_path: str, batch: BatchedDataDict) -> Iterator[dict[str, Any]]:
    """One frozen teacher-like policy (2 FSDP workers, logprob_batch_size 3: uneven microbatches), and one with
    dynamic batching (length-sorted microbatches, cut at their longest row)."""
    cluster = RayVirtualCluster([2], use_gpus=False, name="test-topk", max_colocated_worker_groups=2)
    tokenizer = load_tokenizer(model_path)
    record: dict[str, Any] = {}
    dynamic = DynamicBatchingConfig(enabled=True, train_mb_tokens=64, logprob_mb_tokens=40, sequence_length_round=1)
    policies = [
        Policy(cluster, policy_config(model_path), tokenizer, "topk", init_optimizer=False, init_reference_model=False),
        Policy(
            cluster,
            policy_config(model_path, dynamic_batching=dynamic),
            tokenizer,
            "topk-dynamic",
            init_optimizer=False,
            init_reference_model=False,
        ),
    ]
    try:
        record["plain"] = policies[0].get_topk_logits(batch, k=K)
        record["odd"] = policies[0].get_topk_logits(batch.slice(0, 5), K, micro_batch_size=8)
        record["dynamic"] = policies[1].get_topk_logits(batch, k=K)
        yield record
    finally:
        for policy in policies:
            policy.shutdown()
        cluster.shutdown()


@pytest.mark.parametrize("case", ["plain", "dynamic"])
def test_topk_equals_a_plain_hf_forward(results: dict, hf_topk: tuple, batch: BatchedDataDict, case: str) -> None:
    out = results[case]
    assert set(out) == TopkLogitsOutputSpec.__required_keys__  # NeMo-RL's output spec, no other key
    values, indices = hf_topk
    assert out["topk_logits"].shape == (*batch["input_ids"].shape, K) and out["topk_logits"].dtype == torch.float32
    assert out["topk_indices"].dtype == torch.int64
    torch.testing.assert_close(out["topk_logits"], values, atol=1e-5, rtol=0)
    assert torch.equal(out["topk_indices"], indices)


def test_uneven_shards(results: dict, hf_topk: tuple) -> None:
    torch.testing.assert_close(results["odd"]["topk_logits"], hf_topk[0][:5], atol=1e-5, rtol=0)
    assert torch.equal(results["odd"]["topk_indices"], hf_topk[1][:5])


def test_k_is_checked_on_the_driver() -> None:
    logits = torch.randn(1, 3, 4)
    with pytest.raises(ValueError, match="k=5 exceeds the model's vocabulary size 4"):
        topk_of_logits(logits, 5, torch.tensor([3]), 3)
    with pytest.raises(ValueError, match="k must be an int >= 1, got 0"):
        topk_of_logits(logits, 0, torch.tensor([3]), 3)
