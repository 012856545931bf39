"""vLLM engine layouts that cannot work are refused in one line each, before any actor starts (`engine_layout`,
through `preflight`); the engine group's own placement uses the same rule."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import LlamaConfig, Qwen3MoeConfig

from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
from nemo_rl_clone.algorithms.run.preflight import preflight
from nemo_rl_clone.models.generation.config import VllmConfig
from nemo_rl_clone.models.generation.engine_layout import (
    engine_split_problem,
    engines_per_node,
    kv_heads_per_rank,
    model_layout_problems,
    stage_layers,
)
from nemo_rl_clone.utils.config import load_validated_config
from nemo_rl_clone.utils.errors import UserInputError

REPO = Path(__file__).resolve().parents[2]
KEY = "policy.generation.vllm_cfg"


def dense(heads: int = 8, kv_heads: int = 2, layers: int = 4) -> LlamaConfig:
    return LlamaConfig(  # SmolLM2's vocabulary: 768 × 64, splits 2, 3, 4 ways
        hidden_size=32 * heads,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        num_hidden_layers=layers,
        vocab_size=49152,
    )


def layout(**sizes: int | bool) -> VllmConfig:
    return VllmConfig(**sizes)  # type: ignore[arg-type]


def test_engines_split_a_node_only_into_whole_groups():
    assert engine_split_problem(2, 4, "node 0's") is None and engines_per_node(2, 4) == 2
    assert engine_split_problem(4, 6, "node 1's") == (
        "tensor_parallel_size x pipeline_parallel_size = 4 devices per engine does not divide node 1's 6 generation "
        "devices (an engine spans devices of one node)"
    )
    assert "(cluster.gpus_per_node; an engine" in str(engine_split_problem(3, 2, "a node's", "cluster.gpus_per_node"))


@pytest.mark.parametrize(
    ("tp", "kv_heads", "per_rank"),
    [(1, 2, 2), (2, 2, 1), (4, 2, 1), (8, 8, 1), (2, 8, 4)],  # TP > KV heads: each rank holds one copied head
)
def test_kv_heads_per_rank(tp, kv_heads, per_rank):
    assert kv_heads_per_rank(kv_heads, tp) == per_rank
    assert not model_layout_problems(layout(tensor_parallel_size=tp), dense(heads=8, kv_heads=kv_heads), KEY)


def test_stage_layers_is_the_largest_stage():
    assert [stage_layers(30, pp) for pp in (1, 2, 4, 7, 30)] == [30, 15, 8, 5, 1]


def test_heads_kv_heads_and_layers_that_do_not_split():
    assert model_layout_problems(layout(tensor_parallel_size=3), dense(heads=8), KEY) == [
        f"{KEY}.tensor_parallel_size: 3 must divide the model's num_attention_heads=8 (each engine rank holds whole "
        "heads)"
    ]
    # 8 heads split 4 ways, but 6 KV heads neither split 4 ways nor copy evenly onto 4 ranks
    (kv_line,) = model_layout_problems(layout(tensor_parallel_size=4), dense(heads=8, kv_heads=6), KEY)
    assert kv_line.startswith(f"{KEY}.tensor_parallel_size: 4 and the model's num_key_value_heads=6 must divide")
    assert model_layout_problems(layout(pipeline_parallel_size=5), dense(layers=4), KEY) == [
        f"{KEY}.pipeline_parallel_size: 5 is more than the model's num_hidden_layers=4 (each pipeline stage holds "
        "at least one layer)"
    ]
    assert not model_layout_problems(layout(pipeline_parallel_size=4), dense(layers=4), KEY)


def test_the_padded_vocabulary_must_split():
    assert model_layout_problems(layout(tensor_parallel_size=3), dense(heads=6, kv_heads=3), KEY) == []
    odd = dense(heads=6, kv_heads=3)
    odd.vocab_size = 31990  # padded to 32,000 = 500 × 64: not a multiple of 3
    assert model_layout_problems(layout(tensor_parallel_size=3), odd, KEY) == [
        f"{KEY}.tensor_parallel_size: 3 must divide the model's vocabulary padded to a multiple of 64 (32000; "
        "vocab_size=31990), which vLLM splits over the ranks"
    ]


def test_expert_parallelism_needs_experts_that_split():
    moe = Qwen3MoeConfig(num_attention_heads=8, num_key_value_heads=4, num_experts=6, num_hidden_layers=2)
    ep = layout(tensor_parallel_size=4, expert_parallel_size=4)
    assert model_layout_problems(ep, moe, KEY) == [
        f"{KEY}.expert_parallel_size: the engine's expert-parallel size 4 (its tensor_parallel_size) must divide the "
        "model's 6 routed experts"
    ]
    assert not model_layout_problems(layout(tensor_parallel_size=2, expert_parallel_size=2), moe, KEY)
    assert model_layout_problems(layout(tensor_parallel_size=2, enable_expert_parallel=True), dense(), KEY) == [
        f"{KEY}.enable_expert_parallel: expert parallelism needs an MoE model; this one is dense (no routed experts)"
    ]


def engine_lines(tmp_path: Path, *overrides: str) -> list[str]:
    """The engine-layout lines `preflight` raises for grpo_smoke.yaml (tiny-random-llama: 4 heads, 2 KV heads,
    2 layers, dense) with ``overrides``."""
    dirs = [f"logger.log_dir={tmp_path / 'logs'}", f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}"]
    config = load_validated_config(REPO / "configs" / "grpo_smoke.yaml", [*dirs, *overrides], GRPOMasterConfig)
    try:
        preflight(config)
    except UserInputError as error:
        return [line for line in error.problems if "vllm_cfg" in line]
    return []


def test_preflight_refuses_layouts_before_any_actor_starts(tmp_path):
    two = ["cluster.gpus_per_node=2", f"{KEY}.tensor_parallel_size=2"]
    assert engine_lines(tmp_path, *two) == []
    assert engine_lines(tmp_path, "cluster.gpus_per_node=2", f"{KEY}.tensor_parallel_size=4") == [
        f"{KEY}: tensor_parallel_size x pipeline_parallel_size = 4 devices per engine does not divide a node's 2 "
        "generation devices (cluster.gpus_per_node; an engine spans devices of one node)"
    ]
    separate = ["policy.generation.colocated.enabled=false", "policy.generation.colocated.resources.gpus_per_node=1"]
    separate += ["policy.generation.colocated.resources.num_nodes=1", f"{KEY}.tensor_parallel_size=2"]
    (line,) = engine_lines(tmp_path, *separate)
    assert "a node's 1 generation devices (policy.generation.colocated.resources.gpus_per_node;" in line
    assert engine_lines(tmp_path, *two, f"+{KEY}.expert_parallel_size=2") == [
        f"{KEY}.expert_parallel_size: expert parallelism needs an MoE model; this one is dense (no routed experts)"
    ]
