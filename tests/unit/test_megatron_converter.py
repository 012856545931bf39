"""Hugging Face ↔ Megatron Core weight conversion (`nemo_rl_clone.models.policy.megatron.converter`), without processes:
every layout a tensor/pipeline-parallel run can shard into must merge back to the exact Hugging Face tensors.

Models: a tiny Llama (tied embeddings, GQA 4 heads / 2 KV heads) and a tiny Qwen2 (untied head, QKV bias), random
weights so that a swapped row or head shows.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PretrainedConfig, Qwen2Config

from nemo_rl_clone.models.policy.megatron import converter

DIMS = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}


def llama_config(**overrides) -> LlamaConfig:
    return LlamaConfig(**{**DIMS, "tie_word_embeddings": True, **overrides})


def qwen2_config(**overrides) -> Qwen2Config:
    return Qwen2Config(**{**DIMS, "tie_word_embeddings": False, "use_sliding_window": False, **overrides})


def hf_state(config: PretrainedConfig) -> dict[str, torch.Tensor]:
    """A model's state dict with every tensor (biases and norms included) random, so any misplaced row shows."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():  # a tied head is one parameter with the embedding
            param.copy_(torch.randn_like(param))
    return model.state_dict()


MODELS = {"llama_tied": llama_config, "qwen2_untied_qkv_bias": qwen2_config}


@pytest.fixture(params=list(MODELS), scope="module")
def model(request: pytest.FixtureRequest) -> tuple[converter.ModelShape, dict[str, torch.Tensor]]:
    config = MODELS[request.param]()
    return converter.model_shape(config), hf_state(config)


def shard_and_merge(
    full: dict[str, torch.Tensor], shape: converter.ModelShape, tp: int, pp: int, first=None, last=None
) -> dict[str, torch.Tensor]:
    """Cut ``full`` into every (TP rank, PP stage) share as the worker does, then put it back together as
    `gather_hf_state_dict` does (merge TP shards, renumber layers globally)."""
    merged: dict[str, torch.Tensor] = {}
    for stage in range(pp):
        layers = converter.stage_layers(shape.num_layers, pp, stage, first, last)
        shards = [converter.shard_for_rank(full, rank, tp, layers, stage == 0, stage == pp - 1) for rank in range(tp)]
        assert all(shard.keys() == shards[0].keys() for shard in shards)
        for name in shards[0]:
            global_name = converter.to_global_name(name, layers)
            assert global_name not in merged, f"{global_name} is held by two pipeline stages"
            parts = [shard[name] for shard in shards]
            dim = converter.partition_dim(global_name)
            if dim is not None:  # each TP rank holds its 1/tp of the partitioned dimension
                assert all(part.shape[dim] * tp == full[global_name].shape[dim] for part in parts), global_name
            merged[global_name] = converter.merge_tensor_parallel(global_name, parts)
    return merged


def assert_bit_identical(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name


LAYOUTS = [(1, 1), (1, 2), (2, 1), (2, 2)]


@pytest.mark.parametrize(("tp", "pp"), LAYOUTS)
def test_hf_megatron_hf_round_trip_is_bit_identical(model, tp: int, pp: int) -> None:
    shape, hf = model
    full = converter.hf_to_megatron(hf, shape)
    assert ("output_layer.weight" in full) is not shape.tied_embeddings
    assert_bit_identical(converter.megatron_to_hf(shard_and_merge(full, shape, tp, pp), shape), hf)


@pytest.mark.parametrize(("pp", "first", "last"), [(2, 1, None), (2, None, 1), (3, 1, 1), (3, 2, None)])
def test_uneven_pipeline_split_round_trips(model, pp: int, first: int | None, last: int | None) -> None:
    shape, hf = model
    full = converter.hf_to_megatron(hf, shape)
    merged = shard_and_merge(full, shape, 2, pp, first, last)
    assert_bit_identical(converter.megatron_to_hf(merged, shape), hf)


def test_each_stage_converts_back_on_its_own(model) -> None:
    """`megatron_to_hf` takes any subset of layers (one pipeline stage's share) with global layer numbers."""
    shape, hf = model
    full = converter.hf_to_megatron(hf, shape)
    last_stage = {name: t for name, t in full.items() if name.startswith(("decoder.layers.3.", "decoder.final"))}
    got = converter.megatron_to_hf(last_stage, shape)
    assert got and all(name.startswith(("model.layers.3.", "model.norm")) for name in got)
    for name, tensor in got.items():
        assert torch.equal(tensor, hf[name]), name


def test_stage_layers_splits() -> None:
    def split(num_layers: int, pp: int, first=None, last=None) -> list[list[int]]:
        return [list(converter.stage_layers(num_layers, pp, r, first, last)) for r in range(pp)]

    assert split(4, 1) == [[0, 1, 2, 3]]
    assert split(8, 4) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert split(4, 2, first=1) == [[0], [1, 2, 3]]
    assert split(4, 2, last=1) == [[0, 1, 2], [3]]
    assert split(6, 3, first=1, last=1) == [[0], [1, 2, 3, 4], [5]]
    assert split(8, 4, first=1, last=3) == [[0], [1, 2], [3, 4], [5, 6, 7]]
    assert split(4, 2, first=2, last=2) == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match=r"5 layers do not split evenly over 2 pipeline stages"):
        converter.stage_layers(5, 2, 0, None, None)
    with pytest.raises(ValueError, match=r"num_layers_in_first/last_pipeline_stage"):
        converter.stage_layers(6, 3, 0, 1, None)  # 5 layers left for 2 stages


def test_gqa_qkv_is_interleaved_per_query_group_not_concatenated(model) -> None:
    """Megatron's attention reads linear_qkv as [q heads of group 0, k_0, v_0, q heads of group 1, k_1, v_1, ...];
    the plain q|k|v concatenation has the same shape and would load without error, so this guards the layout."""
    shape, hf = model
    assert shape.num_query_groups < shape.num_attention_heads  # GQA, where the two layouts differ
    full = converter.hf_to_megatron(hf, shape)
    attn, hd, per_group = "model.layers.1.self_attn.", shape.head_dim, shape.heads_per_group
    for kind in ("weight", "bias") if shape.qkv_bias else ("weight",):
        q, k, v = (hf[f"{attn}{p}_proj.{kind}"] for p in ("q", "k", "v"))
        qkv = full[f"decoder.layers.1.self_attention.linear_qkv.{kind}"]
        assert qkv.shape == torch.cat([q, k, v]).shape
        assert not torch.equal(qkv, torch.cat([q, k, v]))
        expected = torch.cat(
            [
                torch.cat(
                    [
                        q[g * per_group * hd : (g + 1) * per_group * hd],
                        k[g * hd : (g + 1) * hd],
                        v[g * hd : (g + 1) * hd],
                    ]
                )
                for g in range(shape.num_query_groups)
            ]
        )
        assert torch.equal(qkv, expected)


def test_tensor_parallel_shards_hold_whole_query_groups_and_gate_up_halves(model) -> None:
    shape, hf = model
    full = converter.hf_to_megatron(hf, shape)
    shards = [converter.shard_for_rank(full, r, 2, range(4), True, True) for r in range(2)]
    group_rows = (shape.heads_per_group + 2) * shape.head_dim
    gate, up = hf["model.layers.0.mlp.gate_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"]
    half = shape.ffn_hidden_size // 2
    for rank, shard in enumerate(shards):
        qkv = shard["decoder.layers.0.self_attention.linear_qkv.weight"]
        assert torch.equal(
            qkv, full["decoder.layers.0.self_attention.linear_qkv.weight"][rank * group_rows : (rank + 1) * group_rows]
        )
        fc1 = shard["decoder.layers.0.mlp.linear_fc1.weight"]
        assert torch.equal(fc1, torch.cat([gate[rank * half : (rank + 1) * half], up[rank * half : (rank + 1) * half]]))
        # Row-parallel layers split the input dimension; norms are replicated.
        o_proj = hf["model.layers.0.self_attn.o_proj.weight"]
        width = o_proj.shape[1] // 2
        assert torch.equal(
            shard["decoder.layers.0.self_attention.linear_proj.weight"], o_proj[:, rank * width : (rank + 1) * width]
        )
        assert torch.equal(
            shard["decoder.layers.0.input_layernorm.weight"], hf["model.layers.0.input_layernorm.weight"]
        )


def test_model_shape_reads_the_config() -> None:
    llama, qwen2 = converter.model_shape(llama_config()), converter.model_shape(qwen2_config())
    assert (llama.num_query_groups, llama.head_dim, llama.qkv_bias, llama.tied_embeddings) == (2, 16, False, True)
    assert (qwen2.qkv_bias, qwen2.tied_embeddings, qwen2.heads_per_group) == (True, False, 2)
    assert converter.model_shape(llama_config(attention_bias=True)).qkv_bias
    assert converter.model_shape(llama_config(head_dim=32)).head_dim == 32


def test_model_shape_refuses_unsupported_architectures_and_rope_scaling() -> None:
    gpt2 = llama_config()
    gpt2.architectures = ["GPT2LMHeadModel"]
    with pytest.raises(ValueError) as error:
        converter.model_shape(gpt2)
    assert str(error.value) == (
        "the Megatron backend converts ['LlamaForCausalLM', 'Qwen2ForCausalLM', 'Qwen3ForCausalLM', "
        "'Qwen3MoeForCausalLM']; this model is 'GPT2LMHeadModel' "
        "(policy.megatron_cfg.converter_type names the architecture when the config does not)"
    )
    # converter_type names the architecture when the config does not, and must agree with it when it does.
    anonymous = llama_config()
    anonymous.model_type = "my_llama"  # type: ignore[misc]  # neither architectures nor a known model_type
    with pytest.raises(ValueError, match=r"this model is None"):
        converter.model_shape(anonymous)
    assert converter.model_shape(anonymous, converter_type="LlamaForCausalLM").num_layers == 4
    with pytest.raises(ValueError) as error:
        converter.model_shape(llama_config(), converter_type="Qwen2ForCausalLM")
    assert str(error.value) == (
        "policy.megatron_cfg.converter_type='Qwen2ForCausalLM' but the model is a 'LlamaForCausalLM'; set it to "
        "'LlamaForCausalLM' or null"
    )

    # RoPE of a fixed frequency table converts (tests/unit/test_megatron_model_options.py); one that rescales with
    # the length does not.
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    assert converter.model_shape(llama_config(rope_scaling={**llama3, "original_max_position_embeddings": 64}))
    with pytest.raises(ValueError) as error:
        converter.model_shape(llama_config(rope_scaling={"rope_type": "dynamic", "factor": 2.0}))
    assert str(error.value) == (
        "the Megatron backend runs RoPE of a fixed frequency table (default, linear, llama3, yarn), not 'dynamic' "
        "scaling"
    )
    with pytest.raises(ValueError, match=r"does not convert sliding-window attention \(use_sliding_window=true\)"):
        converter.model_shape(qwen2_config(use_sliding_window=True))


def test_check_tensor_parallel_names_the_size_that_does_not_divide() -> None:
    shape = converter.model_shape(llama_config())
    converter.check_tensor_parallel(shape, 1)
    converter.check_tensor_parallel(shape, 2)
    with pytest.raises(ValueError) as error:
        converter.check_tensor_parallel(shape, 4)
    assert str(error.value) == (
        "policy.megatron_cfg.tensor_model_parallel_size=4 must divide the model's num_key_value_heads=2"
    )
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size=3 must divide the model's num_attention_heads=4"):
        converter.check_tensor_parallel(shape, 3)


def test_unknown_megatron_names_are_refused(model) -> None:
    shape, _ = model
    with pytest.raises(KeyError, match=r"no Hugging Face name for Megatron parameter 'decoder.foo.weight'"):
        converter.megatron_to_hf({"decoder.foo.weight": torch.zeros(1)}, shape)
    with pytest.raises(KeyError, match=r"no Hugging Face name for Megatron layer parameter 'mlp.router.weight'"):
        converter.megatron_to_hf({"decoder.layers.0.mlp.router.weight": torch.zeros(1)}, shape)
