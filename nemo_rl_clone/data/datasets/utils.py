"""NeMo-RL v0.7.0's dataset helpers at its path (``nemo_rl.data.datasets.utils``): reading a dataset from a file or
the hub, filling and merging ``data.train`` / ``data.validation`` entries, the environments a data section names,
and the double-BOS check.

``pil_to_base64`` (images) and ``get_huggingface_cache_path`` (the VLM datasets' cache lookup) belong to the
multimodal datasets, which are not built: reading them stops with one line.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any, TypeAlias

import datasets as hf_datasets
import torch
import torch.utils.data
from transformers import PreTrainedTokenizerBase

from nemo_rl_clone.data.datasets import DataError, unknown_dataset_message
from nemo_rl_clone.utils.unsupported_modules import refusing_getattr

__all__ = [
    "TokenizerType",
    "assert_no_double_bos",
    "extract_necessary_env_names",
    "load_dataset_from_path",
    "merge_datasets",
    "resolve_external_dataset_class",
    "update_single_dataset_config",
]

# NeMo-RL's alias also admits a multimodal processor; those are not built here.
TokenizerType: TypeAlias = PreTrainedTokenizerBase

_MULTIMODAL = "vision and audio inputs (vision-language / audio-language models)"
__getattr__ = refusing_getattr(__name__, {"pil_to_base64": _MULTIMODAL, "get_huggingface_cache_path": _MULTIMODAL})

# A file's extension → the ``datasets`` builder that reads it (NeMo-RL's table).
_FILE_BUILDERS = {
    ".arrow": "arrow",
    ".csv": "csv",
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
    ".txt": "text",
}


def assert_no_double_bos(token_ids: torch.Tensor, tokenizer: TokenizerType) -> None:
    """Fail (``AssertionError``) when the first two of ``token_ids`` are both the tokenizer's BOS token: a chat
    template that adds BOS met a tokenizer that adds it again. A tokenizer without BOS passes."""
    inner = tokenizer if isinstance(tokenizer, PreTrainedTokenizerBase) else getattr(tokenizer, "tokenizer", None)
    if inner is None:
        raise TypeError(f"Unsupported tokenizer type: {type(tokenizer)}")
    bos = inner.bos_token_id
    if bos is None:
        return
    ids = token_ids.tolist()
    assert not (len(ids) > 1 and ids[0] == bos and ids[1] == bos), (
        "Found double BOS token in the first two positions of the message."
    )


def load_dataset_from_path(
    data_path: str | Path, data_subset: str | None = None, data_split: str | None = "train"
) -> Any:
    """The rows at ``data_path``: a local ``.json``/``.jsonl``/``.csv``/``.parquet``/``.arrow``/``.txt`` file, a
    hub dataset id (``data_subset`` its subset), or a folder written by ``Dataset.save_to_disk``. ``data_split``
    picks that split (a local file's rows are its ``train`` split); None keeps ``train`` when there is one, else the
    whole ``DatasetDict``."""
    path = str(data_path)
    builder = _FILE_BUILDERS.get(Path(path).suffix)
    if builder is not None:
        if data_subset is not None:
            raise DataError(f"data.subset: {data_subset!r} is only for hub datasets, not the file {path!r}")
        if not path.startswith(("http://", "https://")) and not Path(path).is_file():
            raise DataError(f"data.data_path: file {path!r} does not exist")
        loaded = hf_datasets.load_dataset(builder, data_files=path)
    elif Path(path).is_dir() and _saved_to_disk(Path(path)):
        loaded = hf_datasets.load_from_disk(path)
    else:
        try:
            loaded = hf_datasets.load_dataset(path, data_subset)
        except (ConnectionError, OSError, ValueError) as err:
            raise DataError(f"data.data_path: could not load {path!r}: {type(err).__name__}: {err}") from err
    if data_split:
        if isinstance(loaded, hf_datasets.DatasetDict) and data_split not in loaded:
            raise DataError(f"data.split: {path!r} has no split {data_split!r}; it has {sorted(loaded)}")
        return loaded[data_split] if isinstance(loaded, hf_datasets.DatasetDict) else loaded
    if isinstance(loaded, hf_datasets.DatasetDict) and "train" in loaded:
        return loaded["train"]
    return loaded


def _saved_to_disk(folder: Path) -> bool:
    return (folder / "dataset_info.json").is_file() or (folder / "dataset_dict.json").is_file()


def resolve_external_dataset_class(dataset_name: str) -> type:
    """The class a dotted path names (``my_package.my_module.MyDataset``): a user's dataset outside this library.
    A module that does not import, a missing attribute or a non-class is a ``ValueError`` naming the path."""
    module_path, _, class_name = dataset_name.rpartition(".")
    try:
        module = importlib.import_module(module_path)
    except ImportError as err:
        raise DataError(
            f"data.dataset_name: could not import module {module_path!r} of {dataset_name!r}: {err}"
        ) from err
    found = getattr(module, class_name, None)
    if found is None:
        raise DataError(f"data.dataset_name: module {module_path!r} has no attribute {class_name!r}")
    if not isinstance(found, type):
        raise DataError(f"data.dataset_name: {dataset_name!r} is {found!r}, not a dataset class")
    return found


def dataset_class_for(dataset_name: str, registry: Mapping[str, type]) -> type:
    """The class ``registry`` holds under ``dataset_name``, else the class its dotted path names; else a one-line
    error listing the registered names."""
    if dataset_name in registry:
        return registry[dataset_name]
    if "." in dataset_name:
        return resolve_external_dataset_class(dataset_name)
    raise DataError(f"data.dataset_name: {unknown_dataset_message(dataset_name, tuple(registry))}")


def update_single_dataset_config(data_config: MutableMapping[str, Any], default_data_config: Mapping[str, Any]) -> None:
    """Fill ``data_config`` (one dataset entry) in place with the keys of ``default_data_config`` it lacks."""
    for key, value in default_data_config.items():
        data_config.setdefault(key, value)


def merge_datasets(datasets: list[Any]) -> Any:
    """One dataset of the rows of all: the one itself, Hugging Face datasets concatenated, others chained."""
    if not datasets:
        raise ValueError("merge_datasets: expected at least one dataset")
    if len(datasets) == 1:
        return datasets[0]
    if all(isinstance(part, hf_datasets.Dataset) for part in datasets):
        return hf_datasets.concatenate_datasets(datasets)
    return torch.utils.data.ConcatDataset(datasets)


def extract_necessary_env_names(data_config: Mapping[str, Any]) -> list[str]:
    """The environments the ``data`` section's ``train``, ``validation`` and ``default`` entries name
    (``env_name``), each once; environments configured but named by no entry are left out."""
    names = []
    for key in ("train", "validation", "default"):
        entry = data_config.get(key)
        if entry is not None and "env_name" in entry and entry["env_name"] not in names:
            names.append(entry["env_name"])
    return names
