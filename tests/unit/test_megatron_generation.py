"""Generation by the Megatron policy's own workers (``policy.generation.backend: megatron``,
`models.policy.workers.self_generation`), at two tensor-parallel ranks with sequence parallelism, against Hugging
Face's model and a sampler written here from the definitions.

`test_megatron_policy`'s tiny Llama (fp32) samples 6 prompts of different lengths, 10 new tokens each, at temperature
0.7 with top-k 20 and top-p 0.9, one seed per row. Checked, to 1e-5: each sampled token's logprob is its logprob under
Hugging Face's logits with that processing (temperature, then the 20 largest, then the smallest set whose mass
reaches 0.9); the same logprobs are what the trainer's `get_logprobs` computes on the output; greedy output is Hugging
Face's greedy continuation; a row's sample depends on its seed only, not on the rows beside it; a stop token ends
its row and stays in it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.models.policy.config import PolicyConfig
from nemo_rl_clone.utils.config_validation import validate_config
from tests.unit.test_megatron_policy import ATOL, VOCAB, policy_dict, spawn, tiny_llama_dir

NEW_TOKENS, TEMPERATURE, TOP_K, TOP_P = 10, 0.7, 20, 0.9
LENGTHS = [3, 7, 5, 9, 4, 6]


def generation_config(model_dir: str, stop_token_ids: list[int] | None = None) -> PolicyConfig:
    section = policy_dict(model_dir, 2, 1, sequence_parallel=True)
    section["generation"] = {
        "backend": "megatron",
        "max_new_tokens": NEW_TOKENS,
        "temperature": TEMPERATURE,
        "top_k": TOP_K,
        "top_p": TOP_P,
        "stop_token_ids": stop_token_ids,
    }
    return validate_config(section, PolicyConfig)


def prompts() -> BatchedDataDict:
    generator = torch.Generator().manual_seed(3)
    ids = torch.zeros(len(LENGTHS), max(LENGTHS), dtype=torch.long)
    for row, length in enumerate(LENGTHS):
        ids[row, :length] = torch.randint(3, VOCAB, (length,), generator=generator)
    return BatchedDataDict(
        {"input_ids": ids, "input_lengths": torch.tensor(LENGTHS), "seeds": [100 + row for row in range(len(LENGTHS))]}
    )


# ---------------------------------------------------------------------------- the scenario (run in the children)
def run_generation(model_dir: str, data: BatchedDataDict, stop_token: int) -> dict[str, Any]:
    from nemo_rl_clone.models.huggingface import load_tokenizer
    from nemo_rl_clone.models.policy.megatron.policy_worker import MegatronPolicyWorker

    worker = MegatronPolicyWorker(generation_config(model_dir), load_tokenizer(model_dir), model_dir)
    sampled = worker.generate(data)
    full = BatchedDataDict({"input_ids": sampled["output_ids"], "input_lengths": sampled["unpadded_sequence_lengths"]})
    result = {
        "sampled": sampled,
        "trainer_logprobs": worker.get_logprobs(full)["logprobs"],
        "greedy": worker.generate(data, greedy=True),
        "last_two": worker.generate(data.slice(len(LENGTHS) - 2, len(LENGTHS))),
    }
    worker.cfg.generation.stop_token_ids = [stop_token]
    result["stopped"] = worker.generate(data, greedy=True)
    worker.shutdown()
    return result


# ---------------------------------------------------------------------------- the independent reference
def processed_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """log-softmax of ``logits`` [V] after temperature, top-k and top-p, written from their definitions."""
    scaled = logits.double() / TEMPERATURE
    values, order = scaled.sort(descending=True)
    keep = torch.zeros_like(scaled, dtype=torch.bool)
    probs = torch.softmax(values[:TOP_K], dim=-1)  # top-k first, then top-p over what is left
    mass_before = torch.cumsum(probs, dim=-1) - probs
    kept = order[:TOP_K][mass_before < TOP_P]
    keep[kept] = True
    return torch.log_softmax(scaled.masked_fill(~keep, -torch.inf), dim=-1)


@pytest.fixture(scope="module")
def model_dir(module_tmp_path: Path) -> str:
    return tiny_llama_dir(module_tmp_path)


@pytest.fixture(scope="module")
def hf_model(model_dir: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def greedy_first_tokens(hf_model: Any) -> list[int]:
    data = prompts()
    with torch.no_grad():
        logits = hf_model(input_ids=data["input_ids"]).logits
    return [int(logits[row, length - 1].argmax()) for row, length in enumerate(LENGTHS)]


@pytest.fixture(scope="module")
def generated(model_dir: str, greedy_first_tokens: list[int]) -> dict[str, Any]:
    return spawn(2, run_generation, model_dir, prompts(), greedy_first_tokens[1])


def test_sampled_logprobs_are_hugging_faces_under_the_samplers_processing(generated: dict, hf_model: Any):
    out = generated["sampled"]
    assert out["output_ids"].shape == (len(LENGTHS), max(LENGTHS) + NEW_TOKENS)
    assert out["generation_lengths"].tolist() == [NEW_TOKENS] * len(LENGTHS)  # no stop token in this vocabulary draw
    assert out["truncated"].all()
    worst = 0.0
    for row, length in enumerate(LENGTHS):
        end = length + NEW_TOKENS
        ids = out["output_ids"][row : row + 1, :end]
        with torch.no_grad():
            logits = hf_model(input_ids=ids).logits[0]
        for position in range(length, end):
            token = int(ids[0, position])
            reference = processed_logprobs(logits[position - 1])[token].item()
            assert reference > -torch.inf, (row, position)  # the sampler never draws a token the filters dropped
            worst = max(worst, abs(out["logprobs"][row, position].item() - reference))
        assert (out["logprobs"][row, :length] == 0).all() and (out["logprobs"][row, end:] == 0).all()
    assert worst <= ATOL, worst


def test_the_trainer_computes_the_same_logprobs(generated: dict):
    out = generated["sampled"]
    mask = out["logprobs"] != 0
    difference = (generated["trainer_logprobs"][mask] - out["logprobs"][mask]).abs().max().item()
    assert difference <= 1e-6, difference


def test_greedy_is_hugging_faces_greedy_continuation(generated: dict, hf_model: Any):
    data, out = prompts(), generated["greedy"]
    for row, length in enumerate(LENGTHS):
        expected = hf_model.generate(
            data["input_ids"][row : row + 1, :length],
            attention_mask=torch.ones(1, length, dtype=torch.long),
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
        )[0]
        assert out["output_ids"][row, : length + NEW_TOKENS].tolist() == expected.tolist(), row


def test_a_rows_sample_depends_on_its_seed_only(generated: dict):
    alone, together = generated["last_two"], generated["sampled"]
    for row in range(2):
        full_row = len(LENGTHS) - 2 + row
        end = LENGTHS[full_row] + NEW_TOKENS
        assert alone["output_ids"][row, :end].tolist() == together["output_ids"][full_row, :end].tolist()


def test_a_stop_token_ends_its_row_and_stays_in_it(generated: dict, greedy_first_tokens: list[int]):
    out, stop = generated["stopped"], greedy_first_tokens[1]
    length = LENGTHS[1]
    assert out["generation_lengths"][1].item() == 1 and not out["truncated"][1].item()
    assert out["output_ids"][1, length].item() == stop
    assert out["unpadded_sequence_lengths"][1].item() == length + 1
    for row, first in enumerate(greedy_first_tokens):  # rows whose greedy path meets the stop token end there too
        tokens = out["output_ids"][row, LENGTHS[row] : LENGTHS[row] + out["generation_lengths"][row]].tolist()
        assert (stop in tokens) == (not out["truncated"][row].item()), row
        assert first == tokens[0], row
