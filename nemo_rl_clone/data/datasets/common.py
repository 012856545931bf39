"""Shared loading code: raw rows through ``datasets``, the common row form, splits, and the processed dataset.

Every loader returns a :class:`LoadedDataset` whose rows have the common form
``{"problem": str, "expected_answer": str, "task_name": str}`` (reasoning-gym rows add ``"extra_env_info"``).
Rows are validated while they are mapped: a missing or empty field raises an error naming the source, the row
index (0-based, in file order) and the field as the source spells it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import datasets
import torch.utils.data

from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.data.datasets.utils import TokenizerType, assert_no_double_bos
from nemo_rl_clone.data.interfaces import DatumSpec, TaskDataProcessFn, TaskDataSpec
from nemo_rl_clone.data.processors import DATA_PROCESSORS

MATH_TASK = "math"
LOCAL_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}

# A split's rows: a Hugging Face ``datasets.Dataset`` or, for generated data, a list of dicts. Both support
# ``len(rows)`` and ``rows[i] -> dict``.
Rows: TypeAlias = datasets.Dataset | list[dict[str, Any]]


class DatasetLoadError(DataError):
    """A dataset could not be loaded (unreachable hub, missing file, unsupported format)."""


@dataclass
class LoadedDataset:
    """Rows of one dataset in the common form. Evaluation-only sets (AIME 2024, MATH-500) fill only
    ``validation``."""

    name: str
    train: Rows | None
    validation: Rows | None


@dataclass(frozen=True)
class Field:
    """How one common field is read from a raw row.

    Attributes:
        source: the field as the source names it, for error messages (e.g. ``"reward_model.ground_truth"``).
        column: the top-level column that must exist.
        get: reads the value from a raw row; KeyError / IndexError / TypeError mean "missing".
    """

    source: str
    column: str
    get: Callable[[Mapping[str, Any]], Any]


def column(name: str) -> Field:
    """A field that is a plain top-level column."""
    return Field(source=name, column=name, get=lambda row: row[name])


def load_raw_rows(
    dataset_name: str,
    hub_id: str,
    hub_split: str,
    data_path: str | None,
    hub_subset: str | None = None,
    file_format: str | None = None,
    csv_options: Mapping[str, Any] | None = None,
) -> datasets.Dataset:
    """Rows of ``hub_id`` (subset ``hub_subset``, split ``hub_split``) from the Hugging Face hub, or of a local
    file in the same format.

    ``data_path`` is a ``.json`` (array or JSON Lines), ``.jsonl``, ``.parquet`` or ``.csv`` file, or an http(s)
    URL of one; ``file_format`` (``json``, ``jsonl``, ``parquet``, ``csv``) overrides what the extension says.
    ``csv_options`` go to the CSV reader (e.g. ``keep_default_na=False``) when the file is a CSV.
    """
    if data_path is not None:
        path = Path(data_path)
        suffix = f".{file_format}" if file_format else path.suffix.lower()
        builder = LOCAL_FORMATS.get(suffix)
        if builder is None:
            raise DatasetLoadError(
                f"{dataset_name}: cannot read {data_path!r}: unsupported file type {suffix!r}; "
                f"use one of {sorted(LOCAL_FORMATS)}"
            )
        remote = data_path.startswith(("http://", "https://"))
        if not remote and not path.is_file():
            raise DatasetLoadError(f"{dataset_name}: data file {data_path!r} does not exist")
        options = dict(csv_options or {}) if builder == "csv" else {}
        try:
            return datasets.load_dataset(
                builder, data_files=data_path if remote else str(path), split="train", **options
            )
        except (ConnectionError, OSError) as err:  # a URL without network
            raise DatasetLoadError(
                f"{dataset_name}: could not read {data_path!r}: {type(err).__name__}: {err}"
            ) from err
    try:
        return datasets.load_dataset(hub_id, hub_subset, split=hub_split)
    except (ConnectionError, OSError, ValueError) as err:  # offline, unknown repo, unknown split
        raise DatasetLoadError(
            f"{dataset_name}: could not load {hub_id!r} (split {hub_split!r}) from the Hugging Face hub: "
            f"{type(err).__name__}: {err}. Without hub access, download it elsewhere and point data_path "
            "(data.data_path / data.val_data_path) at a local .jsonl/.json/.parquet file in the same format"
        ) from err


def to_common_math_form(
    raw: datasets.Dataset, source: str, problem: Field, answer: Field, task_name: str = MATH_TASK
) -> datasets.Dataset:
    """Map raw rows to ``{"problem", "expected_answer", "task_name"}``, validating every row.

    Raises:
        ValueError: a required column is absent (naming the columns present), or a row's field is missing or
            empty (naming the row index and the field).
    """
    missing = [f.column for f in (problem, answer) if f.column not in raw.column_names]
    if missing:
        raise DataError(
            f"{source}: missing column(s) {missing}; the file has {raw.column_names}. "
            f"Expected the source's format: {problem.source!r} for the problem, {answer.source!r} for the answer"
        )

    def rekey(batch: dict[str, list[Any]], indices: list[int]) -> dict[str, list[Any]]:
        rows = [dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True)]
        out: dict[str, list[Any]] = {"problem": [], "expected_answer": [], "task_name": []}
        for index, row in zip(indices, rows, strict=True):
            out["problem"].append(_read(row, problem, index, source))
            out["expected_answer"].append(_read(row, answer, index, source))
            out["task_name"].append(task_name)
        return out

    return raw.map(rekey, batched=True, with_indices=True, remove_columns=raw.column_names, desc=f"{source}")


def _read(row: Mapping[str, Any], field: Field, index: int, source: str) -> str:
    try:
        value = field.get(row)
    except (KeyError, IndexError, TypeError):
        value = None
    if value is None or not str(value).strip():
        raise DataError(f"{source}: row {index}: field {field.source!r} is missing or empty")
    return str(value)


def split_train_validation(
    rows: datasets.Dataset, split_validation_size: float, seed: int, source: str
) -> tuple[datasets.Dataset, datasets.Dataset | None]:
    """Hold out a seeded random fraction ``split_validation_size`` of ``rows`` (0 → no validation split)."""
    if not 0.0 <= split_validation_size < 1.0:
        raise DataError(f"{source}: split_validation_size must be in [0, 1), got {split_validation_size}")
    if split_validation_size == 0.0:
        return rows, None
    num_val = round(split_validation_size * len(rows))
    if num_val < 1 or num_val >= len(rows):
        raise DataError(
            f"{source}: split_validation_size={split_validation_size} of {len(rows)} rows leaves "
            f"{num_val} validation rows; both splits need at least one"
        )
    parts = rows.train_test_split(test_size=num_val, seed=seed, shuffle=True)
    return parts["train"], parts["test"]


def validation_source(
    val_data_path: str | None, split_validation_size: float | None, default_split_size: float, source: str
) -> tuple[str | None, float]:
    """Resolve where validation rows come from: ``(val_data_path or None, fraction to split off the training
    rows)``. Giving both a validation file and a positive split is ambiguous and rejected."""
    if val_data_path is not None and split_validation_size:
        raise DataError(
            f"{source}: give either val_data_path or split_validation_size > 0, not both "
            f"(got {val_data_path!r} and {split_validation_size})"
        )
    if val_data_path is not None:
        return val_data_path, 0.0
    return None, default_split_size if split_validation_size is None else split_validation_size


class AllTaskProcessedDataset(torch.utils.data.Dataset):
    """Rows processed lazily into :class:`DatumSpec` by the processor of each row's ``task_name`` (NeMo-RL's
    signature).

    Args:
        dataset: rows (a split of a :class:`LoadedDataset`, or any sequence of dicts).
        tokenizer: tokenizer with a chat template.
        default_task_data_spec: the prompt spec of every row; here also a ``task_name → spec`` mapping, or None.
        task_data_processors: NeMo-RL's ``task_name → (spec, processor)`` (a task's spec takes the default spec's
            unset prompts) or one processor for all rows; None: this library's processor of each row's
            ``task_name`` (:data:`DATA_PROCESSORS`) with ``default_task_data_spec``.
        task_data_preprocessors: ``task_name → function`` (or one function) applied to a row before processing.
        max_seq_length: prompts longer than this are truncated and get ``loss_multiplier = 0``.
        env_name: the environment that scores every row (its ``task_name`` after processing); None keeps the
            rows' own.
    """

    def __init__(
        self,
        dataset: Rows | Any,
        tokenizer: TokenizerType,
        default_task_data_spec: TaskDataSpec | Mapping[str, TaskDataSpec] | None,
        task_data_processors: Mapping[str, Any] | TaskDataProcessFn | None = None,
        task_data_preprocessors: Mapping[str, Callable[[Any], Any]] | Callable[[Any], Any] | None = None,
        max_seq_length: int | None = None,
        env_name: str | None = None,
    ):
        self.dataset = dataset
        self.tokenizer = tokenizer
        self.default_task_data_spec = default_task_data_spec
        self.task_data_processors = task_data_processors
        self.task_data_preprocessors = task_data_preprocessors
        self.max_seq_length = max_seq_length
        self.env_name = env_name
        self._bos_checked = False
        if isinstance(task_data_processors, Mapping) and isinstance(default_task_data_spec, TaskDataSpec):
            for spec, _ in task_data_processors.values():
                spec.copy_defaults(default_task_data_spec)

    def __len__(self) -> int:
        return len(self.dataset)

    def encode_single(self, text: str | list[str]) -> tuple[list[int] | torch.Tensor, int]:
        """``text``'s token ids (no special tokens) and their count; a list of turns of one conversation gives the
        turns' ids joined into one tensor."""
        if isinstance(text, str):
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            return ids, len(ids)
        if isinstance(text, list):
            parts = [torch.tensor(self.tokenizer.encode(turn, add_special_tokens=False)) for turn in text]
            return torch.cat(parts), sum(len(part) for part in parts)
        raise ValueError(f"text must be a string or a list of strings, got {type(text)}")

    def __getitem__(self, idx: int) -> DatumSpec:
        row = self.dataset[idx]
        preprocess = self.task_data_preprocessors
        if isinstance(preprocess, Mapping):
            preprocess = preprocess.get(row.get("task_name") or MATH_TASK)
        if preprocess is not None:
            row = preprocess(row)
        spec, processor = self._spec_and_processor(row.get("task_name") or MATH_TASK, idx)
        datum = processor(row, spec, self.tokenizer, self.max_seq_length, idx)
        if not self._bos_checked and datum.get("message_log"):
            # Checked once: a template that adds BOS plus a tokenizer that adds it again shows on any row.
            assert_no_double_bos(datum["message_log"][0]["token_ids"], self.tokenizer)
            self._bos_checked = True
        if self.env_name is not None:
            datum["task_name"] = self.env_name
        return datum

    def _spec_and_processor(self, task_name: str, idx: int) -> tuple[Any, Any]:
        processors = self.task_data_processors
        if isinstance(processors, Mapping):
            if task_name not in processors:
                raise KeyError(f"row {idx}: no data processor for task_name {task_name!r}; known: {sorted(processors)}")
            return processors[task_name]
        if processors is None and task_name not in DATA_PROCESSORS:
            raise KeyError(
                f"row {idx}: no data processor for task_name {task_name!r}; known: {sorted(DATA_PROCESSORS)}"
            )
        processor = DATA_PROCESSORS[task_name] if processors is None else processors
        specs = self.default_task_data_spec
        if specs is None or isinstance(specs, TaskDataSpec):
            return specs, processor
        if task_name not in specs:
            raise KeyError(f"row {idx}: no TaskDataSpec for task_name {task_name!r}; known: {sorted(specs)}")
        return specs[task_name], processor
