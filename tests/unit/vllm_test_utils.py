"""Shared pieces of the vLLM tests: a tiny engine config, prompt batches and the HF logprob reference."""

from __future__ import annotations

from typing import Any

import torch

from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.models.generation.config import GenerationConfig, VllmConfig

PROMPTS = ["The capital of France is", "Hello", "def add(a, b):", "Once upon a time, in a land far away, there"]
MAX_NEW_TOKENS = 12
MAX_MODEL_LEN = 64
LOGPROB_ATOL = 1e-4  # fp32 engine vs fp32 HF forward (measured ~1e-6)


def tiny_config(**overrides: Any) -> GenerationConfig:
    """fp32, eager, a 64 MiB KV cache (the CPU default would be 1 GiB per engine)."""
    vllm_cfg = VllmConfig(
        precision="float32", max_model_len=MAX_MODEL_LEN, enforce_eager=True, kv_cache_memory_bytes=64 << 20
    )
    return GenerationConfig(**{"max_new_tokens": MAX_NEW_TOKENS, "vllm_cfg": vllm_cfg, **overrides})


def prompt_batch(tokenizer: Any, prompts: list[str], **extra: Any) -> BatchedDataDict:
    encoded = tokenizer(prompts, padding=True, return_tensors="pt")
    return BatchedDataDict(input_ids=encoded["input_ids"], input_lengths=encoded["attention_mask"].sum(dim=1), **extra)


def generated_tokens(out: BatchedDataDict, data: BatchedDataDict, row: int) -> list[int]:
    start = int(data["input_lengths"][row])
    return out["output_ids"][row, start : start + int(out["generation_lengths"][row])].tolist()


def hf_logprobs(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """log p(ids[i] | ids[:i]) for i >= 1, from one forward of the plain HF model."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits[:-1], dim=-1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)


def right_padded_tokenizer() -> Any:
    """The tiny built-in models' tokenizer, padding on the right (the batch layout engines take)."""
    from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer

    tokenizer = load_tokenizer(TINY_LLAMA)
    tokenizer.padding_side = "right"
    return tokenizer


def engine_vs_reference_gap(generation: Any, tokenizer: Any, reference: torch.nn.Module) -> float:
    """Largest |engine logprob - reference logprob| over the greedy continuations of `PROMPTS` (every engine of
    ``generation`` serves some of them)."""
    data = prompt_batch(tokenizer, PROMPTS)
    out = generation.generate(data, greedy=True)
    gap = 0.0
    for row in range(data.size):
        length, total = int(data["input_lengths"][row]), int(out["unpadded_sequence_lengths"][row])
        expected = hf_logprobs(reference, out["output_ids"][row, :total].tolist())[length - 1 :]
        gap = max(gap, float((out["logprobs"][row, length:total] - expected).abs().max()))
    return gap
