"""The refit correctness gate (docs/generation_and_refit.md) as one scenario, shared by test_refit_colocated.py and
test_refit_collective.py.

Generate (sampled) → train one NLL step on the generations → refit → generate again → the policy's logprobs of the
new generations vs the engine's: ``token_mult_prob_error`` = masked mean of exp(|lp_engine − lp_policy|) over the
generated tokens must be ≤ 1.01 (fp32). The same metric between the pre-training generations and the trained
policy must be clearly larger, so the gate can tell stale weights from fresh ones.
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_rl_clone.algorithms.loss import NLLLossFn
from nemo_rl_clone.algorithms.utils import masked_mean
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl_clone.models.generation.config import GenerationConfig, VllmConfig
from nemo_rl_clone.models.policy.config import OptimizerConfig, PolicyConfig
from nemo_rl_clone.rollout.refit import init_refit_collective, prepare_refit, refit_policy_generation

PROMPTS = ["The capital of France is", "Hello", "def add(a, b):", "Once upon a time, in a land far away, there"]
MAX_NEW_TOKENS = 16
GATE = 1.01
STALE_MIN = 1.05  # one step at lr 1e-2 moves the tiny model's logprobs far more than this


def policy_config(model_path: str, lora: bool = False) -> PolicyConfig:
    """``lora``: train LoRA adapters (dim 8, alpha 32) instead of all weights; the engines then get merged weights."""
    config = PolicyConfig(
        model_name=model_path,
        train_global_batch_size=4,
        train_micro_batch_size=2,
        logprob_batch_size=4,
        max_total_sequence_length=64,
        precision="float32",
        optimizer=OptimizerConfig(
            "torch.optim.AdamW", {"lr": 1e-2, "weight_decay": 0.0, "betas": [0.9, 0.999], "eps": 1e-8}
        ),
        scheduler=None,  # constant LR: the first step takes the full 1e-2
    )
    config.dtensor_cfg.lora_cfg.enabled = lora
    return config


def generation_config(colocated: bool) -> GenerationConfig:
    config = GenerationConfig(
        max_new_tokens=MAX_NEW_TOKENS,
        vllm_cfg=VllmConfig(precision="float32", max_model_len=64, enforce_eager=True, kv_cache_memory_bytes=64 << 20),
    )
    config.colocated.enabled = colocated
    return config


def sequences(data: BatchedDataDict, out: BatchedDataDict) -> BatchedDataDict:
    """The generated sequences as a training batch: loss and logprob checks on the generated tokens only."""
    positions = torch.arange(out["output_ids"].shape[1])
    generated = (positions >= data["input_lengths"][:, None]) & (positions < out["unpadded_sequence_lengths"][:, None])
    return BatchedDataDict(
        input_ids=out["output_ids"],
        input_lengths=out["unpadded_sequence_lengths"],
        token_mask=generated.float(),
        sample_mask=torch.ones(out.size),
    )


def token_mult_prob_error(engine_logprobs: torch.Tensor, policy_logprobs: torch.Tensor, mask: torch.Tensor) -> float:
    return float(masked_mean(torch.exp((engine_logprobs - policy_logprobs).abs()), mask))


def run_refit_gate(
    policy: Any, generation: Any, tokenizer: Any, colocated: bool, train_cluster: RayVirtualCluster
) -> dict[str, float]:
    """Run the scenario; returns ``{"error_after_refit", "error_stale", "refit_s"}``."""
    prepare_refit(policy, generation)
    if not colocated:
        init_refit_collective(policy, generation, train_cluster, timeout_s=120.0)
    encoded = tokenizer(PROMPTS, padding=True, return_tensors="pt")
    data = BatchedDataDict(
        input_ids=encoded["input_ids"],
        input_lengths=encoded["attention_mask"].sum(dim=1),
        seeds=torch.arange(len(PROMPTS)),
    )
    refit_policy_generation(policy, generation, colocated)  # same weights: exercises the path end to end
    before = generation.generate(data)
    generation.finish_generation()

    policy.prepare_for_training()
    policy.train(sequences(data, before), NLLLossFn())
    policy.finish_training()
    refit_s = refit_policy_generation(policy, generation, colocated)

    after = generation.generate(data)
    generation.finish_generation()
    policy.prepare_for_lp_inference()
    batch_after, batch_before = sequences(data, after), sequences(data, before)
    lp_after = policy.get_logprobs(batch_after)["logprobs"]
    lp_before = policy.get_logprobs(batch_before)["logprobs"]
    return {
        "error_after_refit": token_mult_prob_error(after["logprobs"], lp_after, batch_after["token_mask"]),
        "error_stale": token_mult_prob_error(before["logprobs"], lp_before, batch_before["token_mask"]),
        "refit_s": refit_s,
    }
