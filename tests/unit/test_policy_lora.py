"""LoRA on the DTensor backend: 2 FSDP workers on a real local Ray cluster train only the adapters, exactly as a
single-process Hugging Face model with the same adapters (`lora.apply`) and AdamW does; engines and exports see the
merged weights under the base model's names; checkpoints hold the adapters only and resume on another DP size; the
reference model is the base model. fp32, tolerances as in test_policy_dtensor (float-sum reordering, ~1e-7)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from nemo_rl_clone.algorithms.loss import NLLLossFn
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl_clone.models.hf_export import load_dcp_model_state_dict
from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer, resolve_model_path
from nemo_rl_clone.models.policy.config import LoraConfig
from nemo_rl_clone.models.policy.dtensor import lora
from nemo_rl_clone.models.policy.lm_policy import Policy
from tests.unit.policy_reference import ReferenceTrainer, hf_logprobs, make_batch, max_state_diff, policy_config

LORA = LoraConfig(enabled=True, dim=4, alpha=8)
ADAPTED_LAYERS = 2 * 7  # the tiny Llama's 2 decoder layers x 7 projections


@pytest.fixture(scope="module")
def model_path() -> str:
    return resolve_model_path(TINY_LLAMA)


@pytest.fixture(scope="module")
def batch(model_path: str) -> BatchedDataDict:
    return make_batch(load_tokenizer(model_path))


@pytest.fixture(scope="module")
def cluster(ray_local: None) -> Iterator[RayVirtualCluster]:
    cluster = RayVirtualCluster([2], use_gpus=False, name="test-policy-lora")
    yield cluster
    cluster.shutdown()


@pytest.fixture(scope="module")
def lora_two_workers(
    cluster: RayVirtualCluster, model_path: str, batch: BatchedDataDict, module_tmp_path: Path
) -> dict[str, Any]:
    """2 workers: checkpoint of the fresh adapters, logprobs, step 1, reference and current logprobs, step 2,
    checkpoint (+ consolidated HF export), step 3."""
    tokenizer = load_tokenizer(model_path)
    policy = Policy(cluster, policy_config(model_path, dtensor_lora_cfg=LORA), tokenizer, name_prefix="policy-lora")
    record: dict[str, Any] = {"initial_ckpt": module_tmp_path / "step0", "ckpt": module_tmp_path / "step2"}
    try:
        policy.save_checkpoint(str(record["initial_ckpt"] / "weights"))
        record["initial_logprobs"] = policy.get_logprobs(batch)["logprobs"]
        record["step1"] = policy.train(batch, NLLLossFn())
        record["reference_logprobs"] = policy.get_reference_policy_logprobs(batch)["reference_logprobs"]
        record["logprobs1"] = policy.get_logprobs(batch)["logprobs"]
        record["step2"] = policy.train(batch, NLLLossFn())
        checkpoint = record["ckpt"]
        policy.save_checkpoint(
            str(checkpoint / "weights"), str(checkpoint / "optimizer"), save_hf_path=str(checkpoint / "hf")
        )
        record["state2"] = policy.get_full_state_dict_for_refit()
        record["step3"] = policy.train(batch, NLLLossFn())
        record["state3"] = policy.get_full_state_dict_for_refit()
        record["refit_info"] = policy.prepare_refit_info()
    finally:
        policy.shutdown()
    return record


@pytest.fixture(scope="module")
def resumed_one_worker(lora_two_workers: dict[str, Any], model_path: str, batch: BatchedDataDict) -> dict[str, Any]:
    cluster = RayVirtualCluster([1], use_gpus=False, name="test-policy-lora-resume")
    checkpoint = lora_two_workers["ckpt"]
    policy = Policy(
        cluster,
        policy_config(model_path, dtensor_lora_cfg=LORA),
        load_tokenizer(model_path),
        name_prefix="policy-lora-resumed",
        weights_path=str(checkpoint / "weights"),
        optimizer_path=str(checkpoint / "optimizer"),
    )
    try:
        record = {"loaded_state": policy.get_full_state_dict_for_refit(), "step3": policy.train(batch, NLLLossFn())}
        record["state3"] = policy.get_full_state_dict_for_refit()
    finally:
        policy.shutdown()
        cluster.shutdown()
    return record


@pytest.fixture(scope="module")
def reference(lora_two_workers: dict[str, Any], model_path: str, batch: BatchedDataDict) -> dict[str, Any]:
    """The same adapters (read from the workers' first checkpoint) on a plain HF model, trained in one process."""
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    base_state = {name: tensor.clone() for name, tensor in base.state_dict().items()}
    record: dict[str, Any] = {"base_logprobs": hf_logprobs(base, batch), "base_state": base_state}
    lora.apply(base, LORA)
    initial_adapters = load_dcp_model_state_dict(lora_two_workers["initial_ckpt"] / "weights")
    record["initial_adapters"] = initial_adapters
    result = base.load_state_dict(initial_adapters, strict=False)
    assert not result.unexpected_keys
    trainer = ReferenceTrainer(model_path, model=base)
    record["steps"], record["states"] = [], []
    for step in range(3):
        record["steps"].append(trainer.step(batch))
        record["states"].append(lora.merged_state_dict(trainer.model.state_dict(), LORA.scaling))
        if step == 0:
            record["logprobs1"] = hf_logprobs(trainer.model, batch)
    return record


def test_only_the_adapters_are_checkpointed(lora_two_workers: dict, reference: dict) -> None:
    adapters = reference["initial_adapters"]
    assert len(adapters) == 2 * ADAPTED_LAYERS and all(lora.is_adapter_key(name) for name in adapters)
    b = [tensor for name, tensor in adapters.items() if ".lora_B." in name]
    a = [tensor for name, tensor in adapters.items() if ".lora_A." in name]
    assert all((tensor == 0).all() for tensor in b) and all(tensor.abs().sum() > 0 for tensor in a)
    saved = load_dcp_model_state_dict(lora_two_workers["ckpt"] / "weights")
    assert saved.keys() == adapters.keys()


def test_fresh_adapters_give_the_base_model(lora_two_workers: dict, reference: dict) -> None:
    torch.testing.assert_close(lora_two_workers["initial_logprobs"], reference["base_logprobs"], atol=1e-5, rtol=0)


def test_training_matches_the_single_process_lora_reference(lora_two_workers: dict, reference: dict) -> None:
    for step in (1, 2, 3):
        result = lora_two_workers[f"step{step}"]
        expected_loss, expected_norm = reference["steps"][step - 1]
        assert result["loss"].item() == pytest.approx(expected_loss, abs=1e-5)
        assert result["grad_norm"].item() == pytest.approx(expected_norm, abs=1e-5)
    assert lora_two_workers["step1"]["loss"].item() - lora_two_workers["step3"]["loss"].item() > 5e-3  # it learns
    assert max_state_diff(lora_two_workers["state2"], reference["states"][1]) <= 1e-5
    assert max_state_diff(lora_two_workers["state3"], reference["states"][2]) <= 1e-5


def test_base_weights_stay_frozen(lora_two_workers: dict, reference: dict) -> None:
    """Merged weights move only where an adapter sits: embeddings and norms equal the base model bit for bit."""
    state3, base = lora_two_workers["state3"], reference["base_state"]
    assert state3.keys() == base.keys()
    untouched = [name for name in base if "_proj." not in name]
    assert "model.embed_tokens.weight" in untouched and "model.norm.weight" in untouched
    assert all(torch.equal(state3[name], base[name]) for name in untouched)
    moved = (state3["model.layers.0.self_attn.q_proj.weight"] - base["model.layers.0.self_attn.q_proj.weight"]).abs()
    assert moved.max() > 1e-4


def test_reference_model_is_the_base_model(lora_two_workers: dict, reference: dict) -> None:
    """After a step, reference logprobs are the base model's while the policy's own have moved (and the adapters
    are back on for them)."""
    torch.testing.assert_close(lora_two_workers["reference_logprobs"], reference["base_logprobs"], atol=1e-5, rtol=0)
    torch.testing.assert_close(lora_two_workers["logprobs1"], reference["logprobs1"], atol=1e-5, rtol=0)
    assert (lora_two_workers["logprobs1"] - reference["base_logprobs"]).abs().max() > 1e-3


def test_refit_sends_merged_weights_under_base_names(lora_two_workers: dict, reference: dict) -> None:
    expected = {name: (tensor.shape, torch.float32) for name, tensor in reference["base_state"].items()}
    assert lora_two_workers["refit_info"] == expected
    assert {name: (t.shape, t.dtype) for name, t in lora_two_workers["state3"].items()} == expected


def test_checkpoint_hf_export_is_merged(lora_two_workers: dict) -> None:
    exported = AutoModelForCausalLM.from_pretrained(lora_two_workers["ckpt"] / "hf", dtype=torch.float32)
    assert max_state_diff(exported.state_dict(), lora_two_workers["state2"]) == 0.0


def test_resume_on_one_worker_continues_identically(resumed_one_worker: dict, lora_two_workers: dict) -> None:
    assert max_state_diff(resumed_one_worker["loaded_state"], lora_two_workers["state2"]) <= 1e-6
    assert abs(resumed_one_worker["step3"]["loss"].item() - lora_two_workers["step3"]["loss"].item()) <= 1e-6
    assert max_state_diff(resumed_one_worker["state3"], lora_two_workers["state3"]) <= 1e-6


def test_profile_counts_frozen_weights_without_weight_gradients(lora_two_workers: dict) -> None:
    profile = lora_two_workers["step1"]["profile"]
    assert profile.trainable_parameters == sum(
        LORA.dim * (shape[0] + shape[1])
        for name, (shape, _) in lora_two_workers["refit_info"].items()
        if "_proj." in name
    )
    assert profile.trainable_parameters < profile.num_parameters / 10
