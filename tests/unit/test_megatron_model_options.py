"""Model options of NeMo-RL's Megatron recipes, in one spawned process that builds a worker per variant
(`test_megatron_policy`'s tiny Llama: head_dim 16, rows of 16 tokens):

- scaled RoPE (``policy.hf_config_overrides.rope_scaling``, as NeMo-RL's YaRN recipes set it, and Llama 3's own
  scaling; ``original_max_position_embeddings`` 8, so positions reach beyond it): the worker's logprobs equal a plain
  Hugging Face forward of the model with the same overrides, to 1e-5 in fp32;
- ``megatron_cfg.optimizer.params_dtype: bfloat16`` with bf16 compute (NeMo-RL's ``sft_openmathinstruct2_megatron``):
  bit for bit the run of ``float32`` parameters (Float16Module makes those bf16 too; the optimizer's main weights are
  fp32 either way), over logprobs and two Adam steps.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from nemo_rl_clone.models.policy.config import PolicyConfig
from nemo_rl_clone.utils.config_validation import validate_config
from tests.unit.test_megatron_policy import (
    ATOL,
    _step,
    free_port,
    hf_logprobs,
    make_batches,
    max_diff,
    policy_dict,
    spawn,
    tiny_llama_dir,
)

VARIANTS: dict[str, dict[str, Any]] = {
    # NeMo-RL's YaRN recipe keys; mscale_all_dim 0 makes the attention factor 0.1·ln(4) + 1 ≈ 1.139, not 1
    "yarn": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 8,
        "truncate": True,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1,
        "mscale_all_dim": 0,
    },
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8,
    },
}


def overridden_config(model_dir: str, rope: dict[str, Any] | None, tp: int = 1) -> PolicyConfig:
    section = policy_dict(model_dir, tp)
    if rope is not None:
        section["hf_config_overrides"] = {"rope_scaling": rope}
    return validate_config(section, PolicyConfig)


def hf_logprobs_with(model_dir: str, rope: dict[str, Any] | None, data: Any) -> torch.Tensor:
    """[B, S] next-token logprobs of Hugging Face's model built from the overridden config (0 at position 0)."""
    from transformers import AutoModelForCausalLM

    from nemo_rl_clone.models.huggingface import load_hf_config

    config = load_hf_config(model_dir, {"rope_scaling": rope} if rope else None)
    return hf_logprobs(
        model_dir, data, AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=torch.float32)
    )


def run_variants(model_dir: str, batches: list[Any]) -> dict[str, Any]:
    from nemo_rl_clone.models.huggingface import load_tokenizer
    from nemo_rl_clone.models.policy.megatron.policy_worker import MegatronPolicyWorker

    tokenizer, data = load_tokenizer(model_dir), batches[0]
    out: dict[str, Any] = {}
    for name, rope in {"plain": None, **VARIANTS}.items():
        os.environ["MASTER_PORT"] = str(free_port())  # a fresh process group per worker
        worker = MegatronPolicyWorker(overridden_config(model_dir, rope), tokenizer, model_dir, init_optimizer=False)
        out[name] = worker.get_logprobs(data)["logprobs"]
        worker.shutdown()
    for params_dtype in ("float32", "bfloat16"):
        os.environ["MASTER_PORT"] = str(free_port())
        section = policy_dict(model_dir, precision="bfloat16")
        section["megatron_cfg"]["optimizer"]["params_dtype"] = params_dtype
        worker = MegatronPolicyWorker(validate_config(section, PolicyConfig), tokenizer, model_dir)
        run = {"logprobs": worker.get_logprobs(data)["logprobs"], "steps": [_step(worker, b) for b in batches[:2]]}
        out[f"bf16_{params_dtype}_params"] = run
        worker.shutdown()
    return out


@pytest.fixture(scope="module")
def model_dir(module_tmp_path: Path) -> str:
    return tiny_llama_dir(module_tmp_path)


@pytest.fixture(scope="module")
def megatron_logprobs(model_dir: str) -> dict[str, Any]:
    return spawn(1, run_variants, model_dir, make_batches())


@pytest.mark.parametrize("name", list(VARIANTS))
def test_scaled_rope_logprobs_equal_hugging_face(megatron_logprobs: dict, model_dir: str, name: str) -> None:
    data = make_batches()[0]
    expected = hf_logprobs_with(model_dir, VARIANTS[name], data)
    assert max_diff(megatron_logprobs[name], expected) <= ATOL
    # the scaling really changes the model (plain RoPE gives other logprobs)
    assert max_diff(expected, hf_logprobs_with(model_dir, None, data)) > 1e-3
    assert max_diff(megatron_logprobs["plain"], hf_logprobs_with(model_dir, None, data)) <= ATOL


def test_bf16_parameters_train_as_fp32_ones_under_bf16_compute(megatron_logprobs: dict) -> None:
    fp32, bf16 = megatron_logprobs["bf16_float32_params"], megatron_logprobs["bf16_bfloat16_params"]
    assert torch.equal(fp32["logprobs"], bf16["logprobs"])
    for want, got in zip(fp32["steps"], bf16["steps"], strict=True):
        assert (got["loss"], got["grad_norm"]) == (want["loss"], want["grad_norm"])
        assert all(torch.equal(got["state"][name], want["state"][name]) for name in want["state"])
