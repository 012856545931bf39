"""Per-sample tensors of varying size kept as one batch entry (NeMo-RL's ``PackedTensor``), and the processor queries
NeMo-RL's data code makes.

This project trains text-only models, so nothing here produces image, video or audio inputs; `PackedTensor` is
complete, the processor queries answer for real Hugging Face tokenizers and processors, and the media loaders NeMo-RL
has beside them raise `NotImplementedError` naming the missing feature.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


class PackedTensor:
    """A list of tensors (one per sample; ``None`` for a sample without one) that are concatenated along
    ``dim_to_pack`` only when the model needs them (`as_tensor`), e.g. the image patches of each sample.

    ``len()`` and `slice` count list entries (samples), not rows of the packed tensor.
    """

    def __init__(self, tensors: torch.Tensor | Sequence[torch.Tensor | None], dim_to_pack: int) -> None:
        if isinstance(tensors, torch.Tensor):
            self.tensors: list[torch.Tensor | None] = [tensors]
        elif isinstance(tensors, Sequence) and not isinstance(tensors, str):
            if not tensors:
                raise ValueError("PackedTensor needs at least one entry (a tensor, or None for a sample without one)")
            for i, tensor in enumerate(tensors):
                if tensor is not None and not isinstance(tensor, torch.Tensor):
                    raise TypeError(f"PackedTensor entry {i} must be a tensor or None, got {type(tensor).__name__}")
            self.tensors = list(tensors)
        else:
            raise TypeError(f"PackedTensor takes a tensor or a list of tensors, got {type(tensors).__name__}")
        self.dim_to_pack = dim_to_pack

    def __len__(self) -> int:
        return len(self.tensors)

    def __repr__(self) -> str:
        shapes = [None if t is None else tuple(t.shape) for t in self.tensors]
        return f"PackedTensor(shapes={shapes}, dim_to_pack={self.dim_to_pack})"

    def as_tensor(self, device: torch.device | str | None = None) -> torch.Tensor | None:
        """The entries concatenated along ``dim_to_pack`` (``None`` entries skipped; None if all are), optionally
        moved to ``device`` (the entries move too)."""
        if device is not None:
            self.to(device)
        present = [t for t in self.tensors if t is not None]
        return torch.cat(present, dim=self.dim_to_pack) if present else None

    def to(self, device: torch.device | str) -> PackedTensor:
        """Moves every entry to ``device`` in place; returns self."""
        self.tensors = [None if t is None else t.to(device) for t in self.tensors]
        return self

    def slice(self, indices: Sequence[int] | torch.Tensor) -> PackedTensor:
        """A new PackedTensor of the entries at ``indices`` (the tensors are shared, not copied)."""
        picked = indices.tolist() if isinstance(indices, torch.Tensor) else list(indices)
        return PackedTensor([self.tensors[i] for i in picked], self.dim_to_pack)

    @classmethod
    def empty_like(cls, other: PackedTensor) -> PackedTensor:
        """As many ``None`` entries as ``other`` has, with its ``dim_to_pack``."""
        return cls([None] * len(other), other.dim_to_pack)

    @classmethod
    def concat(cls, from_packed_tensors: Sequence[PackedTensor]) -> PackedTensor:
        """All entries of all the PackedTensors, in order (lengths add up)."""
        dim = _common_dim(from_packed_tensors)
        return cls([t for packed in from_packed_tensors for t in packed.tensors], dim)

    @classmethod
    def flattened_concat(cls, from_packed_tensors: Sequence[PackedTensor]) -> PackedTensor:
        """One entry per input PackedTensor, each its packed tensor (`as_tensor`): the packed result equals `concat`'s
        but the length is the number of inputs."""
        dim = _common_dim(from_packed_tensors)
        return cls([packed.as_tensor() for packed in from_packed_tensors], dim)


def _common_dim(packed_tensors: Sequence[PackedTensor]) -> int:
    if not packed_tensors:
        raise ValueError("nothing to concatenate: the list of PackedTensors is empty")
    dims = {packed.dim_to_pack for packed in packed_tensors}
    if len(dims) != 1:
        raise ValueError(f"PackedTensors packed along different dims {sorted(dims)} cannot be concatenated")
    return dims.pop()


def get_multimodal_keys_from_processor(processor: Any) -> list[str]:
    """Model-input keys a processor adds beside the tokenizer's (e.g. ``pixel_values``, ``image_grid_thw``); ``[]``
    for a plain tokenizer. Sorted, so the result is stable."""
    from transformers import PreTrainedTokenizerBase

    if isinstance(processor, PreTrainedTokenizerBase):
        return []
    keys: set[str] = set(getattr(processor, "model_input_names", []))
    for part in ("image_processor", "video_processor", "feature_extractor"):
        keys.update(getattr(getattr(processor, part, None), "model_input_names", []))
    keys.difference_update(processor.tokenizer.model_input_names)
    return sorted(keys)


def get_dim_to_pack_along(processor: Any, key: str) -> int:
    """The dim along which ``key``'s per-sample tensors are packed: 1 for SmolVLM's pixel values, else 0."""
    return 1 if type(processor).__name__ == "SmolVLMProcessor" else 0


def get_multimodal_default_settings_from_processor(processor: Any) -> dict[str, dict[str, Any]]:
    """Video/audio loading defaults of a processor; ``{}`` for a plain tokenizer (the text-only case)."""
    from transformers import PreTrainedTokenizerBase

    if isinstance(processor, PreTrainedTokenizerBase):
        return {}
    raise _not_supported("reading video/audio loading defaults from a multimodal processor")


def resolve_to_image(image_path_or_image: Any) -> Any:
    """Not supported: images are multimodal inputs (see the module docstring)."""
    raise _not_supported("loading images (local path, URL or base64) for vision-language models")


def _not_supported(feature: str) -> NotImplementedError:
    return NotImplementedError(
        f"{feature} is not supported yet: nemo_rl_clone trains text-only models (use a text dataset and model)"
    )
