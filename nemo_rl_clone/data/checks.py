"""Pre-flight checks of a ``data`` section: prompt files, and each local data file — it exists, parses, and its
first rows have the fields the dataset's format needs — in well under a second, before anything heavy starts.

A malformed row further into a file is still found when the dataset is loaded, as one `DataError` naming the row.
"""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path
from typing import Any

from nemo_rl_clone.data.datasets import DataError

# Enough rows to catch a file in the wrong format; the full load checks every row.
FIRST_ROWS = 8


def check_data_config(cfg: Any) -> list[str]:
    """Problems (one line each, naming the key and file) with the files a ``data`` section names."""
    problems = _prompt_file_problems(cfg)
    for key in ("data_path", "val_data_path"):
        path = getattr(cfg, key, None)
        if path is None:
            continue
        try:
            rows = read_first_rows(path, f"data.{key}")
            _check_rows(cfg, key, path, rows)
        except DataError as error:
            problems.append(str(error))
    try:
        _check_sources(cfg)
    except DataError as error:
        problems.append(str(error))
    return problems


def read_first_rows(path: str, key: str, count: int = FIRST_ROWS) -> list[dict[str, Any]]:
    """The first ``count`` rows of a ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv`` file, as dicts; raises
    `DataError` naming ``key``, the file and the line for a missing, unreadable or malformed file."""
    from nemo_rl_clone.data.datasets.common import LOCAL_FORMATS

    file = Path(path)
    if file.suffix.lower() not in LOCAL_FORMATS:
        raise DataError(f"{key}: {path!r}: unsupported file type {file.suffix!r}; use one of {sorted(LOCAL_FORMATS)}")
    if not file.is_file():
        raise DataError(f"{key}: data file {path!r} does not exist")
    try:
        if file.suffix.lower() == ".parquet":
            rows = _parquet_rows(file, count)
        elif file.suffix.lower() == ".csv":
            with file.open(newline="", encoding="utf-8") as handle:
                rows = list(itertools.islice(csv.DictReader(handle), count))
        else:
            rows = _json_rows(file, key, count)
    except (OSError, UnicodeDecodeError, ValueError) as error:
        if isinstance(error, DataError):
            raise
        raise DataError(f"{key}: cannot read {path!r}: {type(error).__name__}: {error}") from None
    if not rows:
        raise DataError(f"{key}: data file {path!r} has no rows")
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(
                f"{key}: {path!r}: row {index} must be an object with named fields, got {type(row).__name__}"
            )
    return rows


def _json_rows(file: Path, key: str, count: int) -> list[Any]:
    with file.open(encoding="utf-8") as handle:
        head = handle.read(1)
        while head.isspace():
            head = handle.read(1)
        if head == "[":  # a JSON array is parsed whole (no cheap way to read its first elements)
            try:
                return list(json.loads(file.read_text(encoding="utf-8"))[:count])
            except json.JSONDecodeError as error:
                raise DataError(f"{key}: {str(file)!r} is not valid JSON (line {error.lineno}): {error.msg}") from None
        handle.seek(0)
        rows = []
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise DataError(f"{key}: {str(file)!r} line {line_number} is not valid JSON: {error.msg}") from None
            if len(rows) == count:
                break
        return rows


def _parquet_rows(file: Path, count: int) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    batches = pq.ParquetFile(file).iter_batches(batch_size=count)
    first = next(batches, None)
    return [] if first is None else first.to_pylist()


def _prompt_file_problems(cfg: Any) -> list[str]:
    from nemo_rl_clone.data.interfaces import resolve_prompt_path

    problems = []
    for key in ("prompt_file", "system_prompt_file"):
        path = getattr(cfg, key, None)
        if path is None:
            continue
        try:
            resolve_prompt_path(path)
        except FileNotFoundError as error:
            problems.append(f"data.{key}: {error}")
    return problems


def _check_rows(cfg: Any, key: str, path: str, rows: list[dict[str, Any]]) -> None:
    """Run the dataset's own row converter (or, for math files, its column check) on the first rows."""
    from nemo_rl_clone.data.config import PreferenceDataConfig, SFTDataConfig

    if isinstance(cfg, SFTDataConfig | PreferenceDataConfig):
        fmt_and_convert = _chat_format(cfg)
        if fmt_and_convert is None:
            return
        fmt, convert = fmt_and_convert
        for index, row in enumerate(rows):
            try:
                convert(row, index, f"{fmt.name} ({path})")
            except DataError as error:
                raise DataError(f"data.{key}: {error}") from None
    elif getattr(cfg, "dataset_name", None) == "local":
        fields = (getattr(cfg, "problem_key", "problem"), getattr(cfg, "solution_key", "answer"))
        for index, row in enumerate(rows):
            for field in fields:
                if not str(row.get(field) or "").strip():
                    raise DataError(f"data.{key}: local ({path}): row {index}: field {field!r} is missing or empty")


def _check_sources(cfg: Any) -> None:
    from nemo_rl_clone.data.config import PreferenceDataConfig, SFTDataConfig
    from nemo_rl_clone.data.datasets.sft import chat_data_sources

    if isinstance(cfg, SFTDataConfig | PreferenceDataConfig):
        fmt_and_convert = _chat_format(cfg)
        if fmt_and_convert is not None:
            chat_data_sources(fmt_and_convert[0], cfg.data_path, cfg.val_data_path, cfg.split_validation_size)


def _chat_format(cfg: Any) -> Any:
    from nemo_rl_clone.data.config import SFTDataConfig
    from nemo_rl_clone.data.datasets.preference import preference_chat_format
    from nemo_rl_clone.data.datasets.sft import sft_chat_format

    if cfg.dataset_name == "champ":
        return None
    return sft_chat_format(cfg) if isinstance(cfg, SFTDataConfig) else preference_chat_format(cfg.dataset_name)
