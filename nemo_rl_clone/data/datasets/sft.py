"""SFT datasets: rows ``{"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": str}, ...]}`` with at least
one assistant message (the tokens trained on).

Formats (``data.dataset_name``):
- ``squad`` (``rajpurkar/squad``): ``context``, ``question``, ``answers.text`` → system = the context, user = the
  question, assistant = the first answer (NeMo-RL's SQuAD form). Validation: the hub's ``validation`` split.
- ``OpenMathInstruct-2`` (``nvidia/OpenMathInstruct-2``): user = ``problem``, assistant = ``generated_solution``.
  Validation: a seeded 5% hold-out of the training rows.
- ``openai_format``: local JSONL, each row ``{chat_key: [{"role", "content"}, ...]}``.
- ``champ``: offline, from the ``champ_dataset`` package (see :mod:`nemo_rl_clone.data.datasets.champ`).

This module also holds the chat-row helpers the preference formats share (:func:`load_chat_format`,
:func:`to_messages`, :func:`with_prompt_spec`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets

from nemo_rl_clone.data.datasets import DataError, unknown_dataset_message
from nemo_rl_clone.data.datasets.common import (
    DatasetLoadError,
    LoadedDataset,
    load_raw_rows,
    split_train_validation,
    validation_source,
)
from nemo_rl_clone.data.interfaces import TaskDataSpec

if TYPE_CHECKING:
    from nemo_rl_clone.data.config import SFTDataConfig

SFT_DATASET_NAMES: tuple[str, ...] = ("squad", "OpenMathInstruct-2", "openai_format", "champ")
CHAT_ROLES = ("system", "user", "assistant", "tool")  # tool: a tool's result in a tool-use transcript
Messages = list[dict[str, str]]
# One raw row (and its 0-based index in the source, and the source's name for errors) → a common row, or None to
# skip it (e.g. a HelpSteer3 tie).
RowConverter = Callable[[Mapping[str, Any], int, str], dict[str, Any] | None]


@dataclass(frozen=True)
class ChatFormat:
    """Where a chat format's rows come from.

    Attributes:
        name: the ``data.dataset_name``.
        hub_id: the hub dataset; None for formats that exist only as local files.
        train_split / validation_split: hub splits (validation_split None: hold out training rows instead).
        default_split_validation_size: hold-out fraction when ``split_validation_size`` is null.
        required_columns: columns a file must have (checked before any row, to name the columns present).
        hub_subset: the hub dataset's subset (config name), e.g. HelpSteer3's ``"preference"``.
        skip_reason: why the converter skips rows (for the log line counting them).
    """

    name: str
    hub_id: str | None
    train_split: str
    validation_split: str | None
    default_split_validation_size: float
    required_columns: tuple[str, ...]
    hub_subset: str | None = None
    skip_reason: str = "skipped by the format"


def load_sft_dataset(cfg: SFTDataConfig, seed: int) -> LoadedDataset:
    """Load the SFT dataset ``cfg`` (the ``data`` section) names; ``seed`` (e.g. ``sft.seed``) seeds hold-outs."""
    name = cfg.dataset_name
    if name not in SFT_DATASET_NAMES:
        raise DataError(unknown_dataset_message(name, SFT_DATASET_NAMES))
    spec = prompt_spec(name, cfg.prompt_file, cfg.system_prompt_file)
    if name == "champ":
        from nemo_rl_clone.data.datasets.champ import load_champ_sft

        reject_file_keys(name, data_path=cfg.data_path, val_data_path=cfg.val_data_path, split=cfg.split)
        loaded = load_champ_sft(cfg.split_validation_size, seed)
        return apply_prompt_spec_to_list_rows(loaded, spec, "messages")
    fmt, convert = sft_chat_format(cfg)
    if cfg.split is not None and name != "OpenMathInstruct-2":
        raise DataError(f"data.split: not used by dataset {name!r}; set it to null")
    return load_chat_format(fmt, convert, cfg.data_path, cfg.val_data_path, cfg.split_validation_size, seed, spec)


def sft_chat_format(cfg: SFTDataConfig) -> tuple[ChatFormat, RowConverter]:
    """The format and row converter of a file-or-hub SFT dataset (any but ``champ``)."""
    if cfg.dataset_name == "squad":
        return SQUAD, _squad_row
    if cfg.dataset_name == "OpenMathInstruct-2":
        fmt = ChatFormat(
            cfg.dataset_name,
            "nvidia/OpenMathInstruct-2",
            cfg.split or "train_1M",
            None,
            0.05,
            ("problem", "generated_solution"),
        )
        return fmt, _omi2_row
    return ChatFormat(cfg.dataset_name, None, "train", None, 0.0, (cfg.chat_key,)), _openai_row_converter(cfg.chat_key)


SQUAD = ChatFormat("squad", "rajpurkar/squad", "train", "validation", 0.0, ("context", "question", "answers"))


def _squad_row(row: Mapping[str, Any], index: int, source: str) -> dict[str, Any]:
    try:
        answer = row["answers"]["text"][0]
    except (KeyError, IndexError, TypeError):
        answer = None
    return {
        "messages": [
            {"role": "system", "content": required_text(row, "context", index, source)},
            {"role": "user", "content": required_text(row, "question", index, source)},
            {"role": "assistant", "content": required_text({"answers.text": answer}, "answers.text", index, source)},
        ]
    }


def _omi2_row(row: Mapping[str, Any], index: int, source: str) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": required_text(row, "problem", index, source)},
            {"role": "assistant", "content": required_text(row, "generated_solution", index, source)},
        ]
    }


def _openai_row_converter(chat_key: str) -> RowConverter:
    def convert(row: Mapping[str, Any], index: int, source: str) -> dict[str, Any]:
        messages = to_messages(row.get(chat_key), "user", index, source, chat_key)
        if not any(m["role"] == "assistant" for m in messages):
            raise DataError(f"{source}: row {index}: field {chat_key!r} has no assistant message to train on")
        return {"messages": messages}

    return convert


# ---------------------------------------------------------------- helpers shared with the preference formats
def load_chat_format(
    fmt: ChatFormat,
    convert: RowConverter,
    data_path: str | None,
    val_data_path: str | None,
    split_validation_size: float | None,
    seed: int,
    spec: TaskDataSpec | None,
) -> LoadedDataset:
    """Train and validation rows of ``fmt``: from the hub or ``data_path``; validation from ``val_data_path``, a
    seeded hold-out of the training rows, or (hub only) the hub's validation split."""
    val_path, split_size = chat_data_sources(fmt, data_path, val_data_path, split_validation_size)
    train = _load_rows(fmt, convert, data_path, fmt.train_split, spec)
    train, validation = split_train_validation(train, split_size, seed, fmt.name)
    if val_path is not None:
        validation = _load_rows(fmt, convert, val_path, fmt.validation_split or fmt.train_split, spec)
    elif validation is None and data_path is None and fmt.validation_split is not None:
        validation = _load_rows(fmt, convert, None, fmt.validation_split, spec)
    return LoadedDataset(name=fmt.name, train=train, validation=validation)


def chat_data_sources(
    fmt: ChatFormat, data_path: str | None, val_data_path: str | None, split_validation_size: float | None
) -> tuple[str | None, float]:
    """Where validation rows come from (see `validation_source`); raises `DataError` when a file-only format lacks
    its training file or any validation source."""
    if fmt.hub_id is None and data_path is None:
        raise DatasetLoadError(f"{fmt.name}: data.data_path is required (a local JSONL file; there is no hub copy)")
    val_path, split_size = validation_source(
        val_data_path, split_validation_size, fmt.default_split_validation_size, fmt.name
    )
    if fmt.hub_id is None and val_path is None and split_size == 0.0:
        raise DataError(
            f"data.val_data_path: {fmt.name} needs a validation source: give data.val_data_path (a local JSONL file) "
            "or data.split_validation_size > 0"
        )
    return val_path, split_size


def _load_rows(
    fmt: ChatFormat, convert: RowConverter, path: str | None, hub_split: str, spec: TaskDataSpec | None
) -> datasets.Dataset:
    raw = load_raw_rows(fmt.name, fmt.hub_id or "", hub_split, path, fmt.hub_subset)
    source = f"{fmt.name} ({path or f'{fmt.hub_id}:{hub_split}'})"
    missing = [c for c in fmt.required_columns if c not in raw.column_names]
    if missing:
        raise DataError(f"{source}: missing column(s) {missing}; the file has {raw.column_names}")

    def rekey(batch: dict[str, list[Any]], indices: list[int]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        for position, index in enumerate(indices):
            row = convert({key: values[position] for key, values in batch.items()}, index, source)
            if row is None:
                continue
            for key, value in apply_prompt_spec(row, spec).items():
                out.setdefault(key, []).append(value)
        return out

    if path is not None and _has_mixed_type_columns(raw, fmt.required_columns):
        # `datasets` stores a column mixing text and lists as JSON text and decodes text that looks like JSON
        # ("4" comes back as the int 4), so such a file's rows are read as written and converted here instead.
        raw_rows = read_json_rows(path, source)
        converted = [convert(row, index, source) for index, row in enumerate(raw_rows)]
        rows = datasets.Dataset.from_list([apply_prompt_spec(row, spec) for row in converted if row is not None])
    else:
        rows = raw.map(rekey, batched=True, with_indices=True, remove_columns=raw.column_names, desc=source)
    if len(rows) < len(raw):
        print(f"{source}: skipped {len(raw) - len(rows)} of {len(raw)} rows ({fmt.skip_reason})")
    return rows


def _has_mixed_type_columns(raw: datasets.Dataset, columns: Sequence[str]) -> bool:
    json_feature = getattr(datasets, "Json", None)
    return json_feature is not None and any(isinstance(raw.features.get(c), json_feature) for c in columns)


def read_json_rows(path: str, source: str) -> list[dict[str, Any]]:
    """Rows of a JSON array file or a JSON Lines file (blank lines skipped), exactly as written."""
    text = Path(path).read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        rows = json.loads(text)
    else:
        rows = []
        for line_number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise DataError(f"{source}: line {line_number} is not valid JSON: {err}") from None
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"{source}: row {index} must be a JSON object, got {type(row).__name__}")
    return rows


def required_text(row: Mapping[str, Any], field: str, index: int, source: str) -> str:
    """``row[field]`` as a non-empty string; otherwise an error naming the source, row index and field."""
    value = row.get(field)
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{source}: row {index}: field {field!r} is missing or empty")
    return value


def to_messages(value: Any, default_role: str, index: int, source: str, field: str) -> Messages:
    """A field holding either text (one message of ``default_role``) or a list of ``{"role", "content"}``."""
    if isinstance(value, str) and value.strip():
        return [{"role": default_role, "content": value}]
    if isinstance(value, str) or value is None or (isinstance(value, Sequence) and len(value) == 0):
        raise DataError(f"{source}: row {index}: field {field!r} is missing or empty")
    if not isinstance(value, Sequence):
        raise DataError(
            f"{source}: row {index}: field {field!r} must be a string or a list of messages, got {type(value).__name__}"
        )
    messages: Messages = []
    for j, message in enumerate(value):
        if (
            not isinstance(message, Mapping)
            or message.get("role") not in CHAT_ROLES
            or not isinstance(message.get("content"), str)
        ):
            raise DataError(
                f"{source}: row {index}: field {field!r}[{j}] must be {{'role': one of {CHAT_ROLES}, "
                f"'content': str}}, got {message!r:.200}"
            )
        messages.append({"role": message["role"], "content": message["content"]})
    return messages


def prompt_spec(name: str, prompt_file: str | None, system_prompt_file: str | None) -> TaskDataSpec | None:
    """The prompt files as a :class:`TaskDataSpec`, or None when neither is set."""
    if prompt_file is None and system_prompt_file is None:
        return None
    return TaskDataSpec(task_name=name, prompt_file=prompt_file, system_prompt_file=system_prompt_file)


def with_prompt_spec(messages: Sequence[Mapping[str, str]], spec: TaskDataSpec | None) -> Messages:
    """``messages`` with the template applied to the first user message and the system prompt prepended when there
    is no system message yet."""
    out = [{"role": m["role"], "content": m["content"]} for m in messages]
    if spec is None:
        return out
    if spec.prompt is not None:
        first_user = next((m for m in out if m["role"] == "user"), None)
        if first_user is not None:
            first_user["content"] = spec.format_prompt(first_user["content"])
    if spec.system_prompt and (not out or out[0]["role"] != "system"):
        out.insert(0, {"role": "system", "content": spec.system_prompt})
    return out


def apply_prompt_spec(row: dict[str, Any], spec: TaskDataSpec | None) -> dict[str, Any]:
    """Apply :func:`with_prompt_spec` to a row's prompt side: SFT ``messages`` or preference ``context``."""
    key = "messages" if "messages" in row else "context"
    return {**row, key: with_prompt_spec(row[key], spec)} if spec is not None else row


def apply_prompt_spec_to_list_rows(loaded: LoadedDataset, spec: TaskDataSpec | None, key: str) -> LoadedDataset:
    """:func:`apply_prompt_spec` on list-of-dict splits (generated data such as champ)."""
    if spec is None:
        return loaded

    def apply(rows: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        return None if rows is None else [{**row, key: with_prompt_spec(row[key], spec)} for row in rows]

    return LoadedDataset(name=loaded.name, train=apply(loaded.train), validation=apply(loaded.validation))


def reject_file_keys(name: str, **keys: Any) -> None:
    """Offline datasets take no files: a set key is an error naming it."""
    for key, value in keys.items():
        if value is not None:
            raise DataError(f"data.{key}: not used by dataset {name!r} (built offline); set it to null")
