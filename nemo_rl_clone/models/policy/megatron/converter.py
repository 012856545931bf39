"""Hugging Face ↔ Megatron Core weights for the Llama family, Qwen2 and Qwen3 (RMSNorm, SwiGLU, RoPE, GQA), dense or
Qwen3-MoE (every layer a top-k mixture of SwiGLU experts).

Three layouts:

- **HF**: the Hugging Face state dict *as transformers holds it in memory* (``model.state_dict()``, what the worker
  loads and what `save_consolidated_hf` takes): a Qwen3-MoE layer's experts are fused, ``mlp.experts.gate_up_proj``
  [experts, 2 × ffn, hidden] (gate rows first) and ``mlp.experts.down_proj`` [experts, hidden, ffn]; the router is
  ``mlp.gate.weight``. (Checkpoints and vLLM name experts one by one: `hf_export.to_checkpoint_layout` maps.)
- **full Megatron**: Megatron Core's local-spec GPT names with *global* layer numbers, unsharded
  (``decoder.layers.{i}.self_attention.linear_qkv.weight``, ...). QKV is one tensor, interleaved per query group
  (each group's queries, then its key, then its value: what Megatron's attention splits), gate and up projections
  are one ``linear_fc1`` (gate first). An MoE layer has ``mlp.router.weight`` and, per expert ``e`` (global number),
  ``mlp.experts.local_experts.{e}.linear_fc{1,2}.weight`` (Megatron's ``SequentialMLP``, one MLP per expert).
- **rank-local**: what one (tensor-parallel rank, pipeline stage, expert-parallel rank) holds: its stage's layers
  renumbered from 0, each tensor-parallel weight cut along its partition dimension (``linear_fc1`` per half, so that
  rank r holds ``[gate_r; up_r]``), its block of experts (expert-parallel rank r holds global experts
  ``r × E/EP + j`` as ``local_experts.{j}``), each expert cut like a dense MLP over the *expert* tensor-parallel
  ranks (``expert_tensor_parallel_size``, which Megatron keeps apart from the attention's tensor parallelism).

Every step is exact (slicing and concatenation only), so HF → Megatron → HF is bit-identical.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
_MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
_QK_NORM_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")

# Megatron name suffix → (HF name suffix, tensor-parallel partition dim or None when replicated).
_LAYER_RENAMES = {
    "input_layernorm.weight": ("input_layernorm.weight", None),
    "self_attention.linear_proj.weight": ("self_attn.o_proj.weight", 1),
    "pre_mlp_layernorm.weight": ("post_attention_layernorm.weight", None),
}
# Qwen3's per-head RMSNorm of queries and keys (Megatron: qk_layernorm), replicated over tensor-parallel ranks.
_QK_NORM_RENAMES = {
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
}
_QKV = "self_attention.linear_qkv"
_FC1 = "mlp.linear_fc1.weight"
_DENSE_FC2 = "mlp.linear_fc2.weight"
_ROUTER = "mlp.router.weight"
# A sequence-classification model's scalar head (reward models, PPO's critic): replicated over tensor-parallel ranks,
# in place of the vocabulary projection. Its full Megatron name differs from the vocabulary projection's, so that it
# is never split; the module (`megatron.value_head.ValueHead`) holds it as ``output_layer.weight``.
_SCORE_HF = "score.weight"
SCORE_MEGATRON = "output_layer.score.weight"
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight$")


@dataclass(frozen=True)
class ModelShape:
    """What the conversion needs to know of a model, read from its Hugging Face config."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    qkv_bias: bool
    tied_embeddings: bool
    qk_layernorm: bool = False
    num_experts: int = 0  # 0: dense MLPs; else every layer is an MoE layer of this many experts
    moe_ffn_hidden_size: int = 0
    moe_topk: int = 0
    norm_topk_prob: bool = False  # the top-k routing weights renormalised to sum to 1

    @property
    def heads_per_group(self) -> int:
        return self.num_attention_heads // self.num_query_groups

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


def model_shape(hf_config: Any, converter_type: str | None = None) -> ModelShape:
    """Read a `ModelShape` from a Hugging Face config; raise ValueError naming what is not supported."""
    declared = (getattr(hf_config, "architectures", None) or [None])[0] or _MODEL_TYPES.get(
        getattr(hf_config, "model_type", "")
    )
    if declared:  # a reward model's or critic's export: the same decoder under a scalar head
        declared = declared.replace("ForSequenceClassification", "ForCausalLM")
    if converter_type and declared and converter_type != declared:
        raise ValueError(
            f"policy.megatron_cfg.converter_type={converter_type!r} but the model is a {declared!r}; set it to "
            f"{declared!r} or null"
        )
    architecture = converter_type or declared
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"the Megatron backend converts {list(SUPPORTED_ARCHITECTURES)}; this model is {architecture!r} "
            "(policy.megatron_cfg.converter_type names the architecture when the config does not)"
        )
    rope_type = rope_scaling_type(hf_config)
    if rope_type not in STATIC_ROPE_TYPES:
        raise ValueError(
            f"the Megatron backend runs RoPE of a fixed frequency table ({', '.join(STATIC_ROPE_TYPES)}), not "
            f"{rope_type!r} scaling"
        )
    if getattr(hf_config, "use_sliding_window", False):
        raise ValueError("the Megatron backend does not convert sliding-window attention (use_sliding_window=true)")
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    moe = _moe_fields(hf_config) if architecture == "Qwen3MoeForCausalLM" else {}
    return ModelShape(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        num_attention_heads=heads,
        num_query_groups=getattr(hf_config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        ffn_hidden_size=hf_config.intermediate_size,
        vocab_size=hf_config.vocab_size,
        qkv_bias=architecture == "Qwen2ForCausalLM" or bool(getattr(hf_config, "attention_bias", False)),
        tied_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        qk_layernorm=architecture in _QK_NORM_ARCHITECTURES,
        **moe,
    )


def _moe_fields(hf_config: Any) -> dict[str, Any]:
    # Megatron's local spec builds one layer kind for the whole decoder: a dense layer among sparse ones has none.
    if getattr(hf_config, "mlp_only_layers", None) or getattr(hf_config, "decoder_sparse_step", 1) != 1:
        raise ValueError(
            "the Megatron backend converts Qwen3-MoE models whose every layer is sparse; this one has dense layers "
            f"(mlp_only_layers={hf_config.mlp_only_layers}, decoder_sparse_step={hf_config.decoder_sparse_step})"
        )
    return {
        "num_experts": hf_config.num_experts,
        "moe_ffn_hidden_size": hf_config.moe_intermediate_size,
        "moe_topk": hf_config.num_experts_per_tok,
        "norm_topk_prob": bool(hf_config.norm_topk_prob),
    }


# RoPE variants whose frequencies do not depend on the sequence: Megatron runs them with Hugging Face's own table
# (`model.scaled_rope`). "dynamic" and "longrope" rescale with the length and are refused.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def rope_scaling_type(hf_config: Any) -> str:
    rope = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    return str(rope.get("rope_type") or rope.get("type") or "default")


def rope_theta(hf_config: Any) -> float:
    """RoPE base frequency (transformers 5 keeps it in ``rope_parameters``, older releases on the config)."""
    parameters = getattr(hf_config, "rope_parameters", None) or {}
    theta = parameters.get("rope_theta") or getattr(hf_config, "rope_theta", None)
    return float(theta) if theta is not None else 10000.0


# --------------------------------------------------------------------------- HF ↔ full Megatron
def hf_to_megatron(hf: Mapping[str, torch.Tensor], shape: ModelShape) -> dict[str, torch.Tensor]:
    """The full Megatron state dict of a Hugging Face one (tensors are views or new concatenations)."""
    out = {
        "embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
        "decoder.final_layernorm.weight": hf["model.norm.weight"],
    }
    if _SCORE_HF in hf:  # a sequence-classification model: its scalar head replaces the vocabulary projection
        out[SCORE_MEGATRON] = hf[_SCORE_HF]
    elif not shape.tied_embeddings:
        out["output_layer.weight"] = hf["lm_head.weight"]
    for i in range(shape.num_layers):
        hf_layer, mg_layer = f"model.layers.{i}.", f"decoder.layers.{i}."
        for mg_name, (hf_name, _) in _LAYER_RENAMES.items():
            out[mg_layer + mg_name] = hf[hf_layer + hf_name]
        attn = hf_layer + "self_attn."
        out[mg_layer + _QKV + ".weight"] = _fuse_qkv(
            hf[attn + "q_proj.weight"], hf[attn + "k_proj.weight"], hf[attn + "v_proj.weight"], shape
        )
        if shape.qkv_bias:
            out[mg_layer + _QKV + ".bias"] = _fuse_qkv(
                hf[attn + "q_proj.bias"], hf[attn + "k_proj.bias"], hf[attn + "v_proj.bias"], shape
            )
        if shape.qk_layernorm:
            for mg_name, hf_name in _QK_NORM_RENAMES.items():
                out[mg_layer + mg_name] = hf[hf_layer + hf_name]
        if shape.is_moe:
            out[mg_layer + _ROUTER] = hf[hf_layer + "mlp.gate.weight"]
            gate_up, down = hf[hf_layer + "mlp.experts.gate_up_proj"], hf[hf_layer + "mlp.experts.down_proj"]
            for expert in range(shape.num_experts):  # HF's fused rows are [gate; up] already, as linear_fc1's
                out[f"{mg_layer}mlp.experts.local_experts.{expert}.linear_fc1.weight"] = gate_up[expert]
                out[f"{mg_layer}mlp.experts.local_experts.{expert}.linear_fc2.weight"] = down[expert]
        else:
            out[mg_layer + _DENSE_FC2] = hf[hf_layer + "mlp.down_proj.weight"]
            out[mg_layer + _FC1] = torch.cat(
                [hf[hf_layer + "mlp.gate_proj.weight"], hf[hf_layer + "mlp.up_proj.weight"]]
            )
    return out


def megatron_to_hf(full: Mapping[str, torch.Tensor], shape: ModelShape) -> dict[str, torch.Tensor]:
    """The Hugging Face state dict of a full Megatron one (any subset of layers: a pipeline stage's share)."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, torch.Tensor]] = {}  # HF fused name → expert number → that expert's slice
    for name, tensor in full.items():
        if name == "embedding.word_embeddings.weight":
            out["model.embed_tokens.weight"] = tensor
            if shape.tied_embeddings:
                out["lm_head.weight"] = tensor
        elif name == "decoder.final_layernorm.weight":
            out["model.norm.weight"] = tensor
        elif name == "output_layer.weight":
            if not shape.tied_embeddings:
                out["lm_head.weight"] = tensor
        elif name == SCORE_MEGATRON:
            out[_SCORE_HF] = tensor
        elif match := _LAYER.match(name):
            prefix, suffix = f"model.layers.{match.group(1)}.", match.group(2)
            if (expert := _EXPERT.match(suffix)) and shape.is_moe:
                fused = "gate_up_proj" if expert.group(2) == "linear_fc1" else "down_proj"
                experts.setdefault(f"{prefix}mlp.experts.{fused}", {})[int(expert.group(1))] = tensor
            else:
                _layer_to_hf(out, prefix, suffix, tensor, shape)
        else:
            raise KeyError(f"no Hugging Face name for Megatron parameter {name!r}")
    if _SCORE_HF in out:  # a scalar-head model ties no vocabulary projection to its embeddings
        out.pop("lm_head.weight", None)
    for hf_name, by_number in experts.items():
        if sorted(by_number) != list(range(shape.num_experts)):
            raise KeyError(f"{hf_name}: experts {sorted(by_number)} of {shape.num_experts} (gather every EP rank's)")
        out[hf_name] = torch.stack([by_number[e] for e in range(shape.num_experts)])
    return out


def _layer_to_hf(out: dict[str, torch.Tensor], prefix: str, suffix: str, tensor: torch.Tensor, shape: ModelShape):
    if suffix in _LAYER_RENAMES:
        out[prefix + _LAYER_RENAMES[suffix][0]] = tensor
    elif suffix in _QK_NORM_RENAMES and shape.qk_layernorm:
        out[prefix + _QK_NORM_RENAMES[suffix]] = tensor
    elif suffix == _ROUTER and shape.is_moe:
        out[prefix + "mlp.gate.weight"] = tensor
    elif suffix == _DENSE_FC2 and not shape.is_moe:
        out[prefix + "mlp.down_proj.weight"] = tensor
    elif suffix in (_QKV + ".weight", _QKV + ".bias"):
        kind = suffix.rsplit(".", 1)[1]
        q, k, v = _split_qkv(tensor, shape)
        for proj, part in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
            out[f"{prefix}self_attn.{proj}.{kind}"] = part
    elif suffix == _FC1 and not shape.is_moe:
        gate, up = tensor.chunk(2)
        out[prefix + "mlp.gate_proj.weight"] = gate
        out[prefix + "mlp.up_proj.weight"] = up
    else:
        raise KeyError(f"no Hugging Face name for Megatron layer parameter {suffix!r}")


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: ModelShape) -> torch.Tensor:
    groups, rest = shape.num_query_groups, q.shape[1:]
    per_group = [
        q.reshape(groups, shape.heads_per_group * shape.head_dim, *rest),
        k.reshape(groups, shape.head_dim, *rest),
        v.reshape(groups, shape.head_dim, *rest),
    ]
    return torch.cat(per_group, dim=1).reshape(-1, *rest)


def _split_qkv(qkv: torch.Tensor, shape: ModelShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    groups, rest = shape.num_query_groups, qkv.shape[1:]
    q_rows = shape.heads_per_group * shape.head_dim
    grouped = qkv.reshape(groups, q_rows + 2 * shape.head_dim, *rest)
    q, k, v = grouped.split([q_rows, shape.head_dim, shape.head_dim], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


# --------------------------------------------------------------------------- tensor / pipeline / expert sharding
def partition_dim(name: str) -> int | None:
    """The dimension a Megatron parameter is split along over tensor-parallel ranks (None: replicated). Experts are
    split over the *expert* tensor-parallel ranks (`is_expert`)."""
    if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return 0
    match = _LAYER.match(name)
    if match is None:
        return None
    suffix = match.group(2)
    if suffix.startswith(_QKV) or suffix == _FC1:
        return 0
    if suffix in ("self_attention.linear_proj.weight", _DENSE_FC2):
        return 1
    if expert := _EXPERT.match(suffix):
        return 0 if expert.group(2) == "linear_fc1" else 1
    return None


def is_expert(name: str) -> bool:
    """Whether ``name`` (rank-local or full) is an expert's weight: sharded over expert-parallel ranks, and over the
    expert tensor-parallel group instead of the tensor-parallel one."""
    match = _LAYER.match(name)
    return match is not None and _EXPERT.match(match.group(2)) is not None


def check_tensor_parallel(shape: ModelShape, tp_size: int) -> None:
    """The sizes tensor parallelism splits must divide evenly (whole query groups and heads per rank)."""
    for what, value in (
        ("num_attention_heads", shape.num_attention_heads),
        ("num_key_value_heads", shape.num_query_groups),
        ("intermediate_size", shape.ffn_hidden_size),
        ("vocab_size", shape.vocab_size),
    ):
        if value % tp_size:
            raise ValueError(
                f"policy.megatron_cfg.tensor_model_parallel_size={tp_size} must divide the model's {what}={value}"
            )


def check_expert_parallel(shape: ModelShape, ep_size: int, etp_size: int) -> None:
    """Whole experts per expert-parallel rank; each expert's MLP split evenly over the expert tensor-parallel ranks."""
    if not shape.is_moe:
        return
    if shape.num_experts % ep_size:
        raise ValueError(
            f"policy.megatron_cfg.expert_model_parallel_size={ep_size} must divide the model's "
            f"num_experts={shape.num_experts}"
        )
    if shape.moe_ffn_hidden_size % etp_size:
        raise ValueError(
            f"policy.megatron_cfg.expert_tensor_parallel_size={etp_size} must divide the model's "
            f"moe_intermediate_size={shape.moe_ffn_hidden_size}"
        )


def stage_layers(num_layers: int, pp_size: int, pp_rank: int, first: int | None, last: int | None) -> range:
    """Global layer numbers of pipeline stage ``pp_rank`` (Megatron's split: optional uneven first/last stages,
    the rest evenly)."""
    if pp_size == 1:
        return range(num_layers)
    counts = [0] * pp_size
    middle_stages, middle_layers = pp_size, num_layers
    if first is not None:
        counts[0], middle_stages, middle_layers = first, middle_stages - 1, middle_layers - first
    if last is not None:
        counts[-1], middle_stages, middle_layers = last, middle_stages - 1, middle_layers - last
    if middle_stages and middle_layers % middle_stages:
        raise ValueError(
            f"{middle_layers} layers do not split evenly over {middle_stages} pipeline stages "
            "(policy.megatron_cfg.pipeline_model_parallel_size / num_layers_in_first/last_pipeline_stage)"
        )
    lo = 1 if first is not None else 0
    hi = pp_size - 1 if last is not None else pp_size
    for stage in range(lo, hi):
        counts[stage] = middle_layers // middle_stages if middle_stages else 0
    start = sum(counts[:pp_rank])
    return range(start, start + counts[pp_rank])


@dataclass(frozen=True)
class ExpertShard:
    """Which experts one rank holds: global experts ``[offset, offset + count)``, each cut to expert tensor-parallel
    share ``etp_rank`` of ``etp_size``. The default holds every expert whole (no expert parallelism)."""

    offset: int = 0
    count: int | None = None  # None: all
    etp_rank: int = 0
    etp_size: int = 1

    @classmethod
    def of_rank(cls, shape: ModelShape, ep_rank: int, ep_size: int, etp_rank: int, etp_size: int) -> ExpertShard:
        count = shape.num_experts // ep_size
        return cls(offset=ep_rank * count, count=count, etp_rank=etp_rank, etp_size=etp_size)


def shard_for_rank(
    full: Mapping[str, torch.Tensor],
    tp_rank: int,
    tp_size: int,
    layers: range,
    pre_process: bool,
    post_process: bool,
    experts: ExpertShard = ExpertShard(),
) -> dict[str, torch.Tensor]:
    """The rank-local state dict of one (TP rank, pipeline stage, expert shard) from the full Megatron one
    (contiguous copies)."""
    out = {}
    for name, tensor in full.items():
        local_name = _local_name(name, layers, pre_process, post_process, experts)
        if local_name is None:
            continue
        if is_expert(name):
            out[local_name] = _tp_slice(name, tensor, experts.etp_rank, experts.etp_size).clone()
        else:
            out[local_name] = _tp_slice(name, tensor, tp_rank, tp_size).clone()
    return out


def _local_name(name: str, layers: range, pre_process: bool, post_process: bool, experts: ExpertShard) -> str | None:
    if name == "embedding.word_embeddings.weight":
        return name if pre_process else None
    if name in ("decoder.final_layernorm.weight", "output_layer.weight"):
        return name if post_process else None
    if name == SCORE_MEGATRON:
        return "output_layer.weight" if post_process else None
    match = _LAYER.match(name)
    assert match is not None, name
    layer, suffix = int(match.group(1)), match.group(2)
    if layer not in layers:
        return None
    if expert := _EXPERT.match(suffix):
        local = int(expert.group(1)) - experts.offset
        if local < 0 or (experts.count is not None and local >= experts.count):
            return None
        suffix = f"mlp.experts.local_experts.{local}.{expert.group(2)}.weight"
    return f"decoder.layers.{layer - layers.start}.{suffix}"


def _is_fc1(name: str) -> bool:
    """A fused [gate; up] weight (dense MLP or expert): each half is split on its own."""
    return name.endswith("linear_fc1.weight")


def _tp_slice(name: str, tensor: torch.Tensor, tp_rank: int, tp_size: int) -> torch.Tensor:
    dim = partition_dim(name)
    if dim is None or tp_size == 1:
        return tensor
    if _is_fc1(name):
        gate, up = tensor.chunk(2)
        return torch.cat([gate.chunk(tp_size)[tp_rank], up.chunk(tp_size)[tp_rank]])
    return tensor.chunk(tp_size, dim=dim)[tp_rank]


def merge_tensor_parallel(name: str, shards: Sequence[torch.Tensor]) -> torch.Tensor:
    """The full tensor of a Megatron parameter from its shards in (expert) TP-rank order (inverse of
    `shard_for_rank`)."""
    dim = partition_dim(name)
    if dim is None or len(shards) == 1:
        return shards[0]
    if _is_fc1(name):
        halves = [shard.chunk(2) for shard in shards]
        return torch.cat([torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])])
    return torch.cat(list(shards), dim=dim)


def to_global_name(local_name: str, layers: range, expert_offset: int = 0) -> str:
    """A rank-local name with its stage's layer offset (and its expert-parallel rank's expert offset) added back."""
    match = _LAYER.match(local_name)
    if match is None:
        return local_name
    suffix = match.group(2)
    if expert := _EXPERT.match(suffix):
        suffix = f"mlp.experts.local_experts.{int(expert.group(1)) + expert_offset}.{expert.group(2)}.weight"
    return f"decoder.layers.{int(match.group(1)) + layers.start}.{suffix}"
