"""A local math file (``dataset_name: local``, NeMo-RL's name): one problem and one answer column per row.

    data: {dataset_name: local, data_path: problems.jsonl, problem_key: problem, solution_key: answer}

Any ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv`` file works; the two columns are named by ``problem_key`` and
``solution_key`` (defaults ``problem`` and ``answer``). An evaluation set: rows are returned as ``validation``.
"""

from __future__ import annotations

from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.data.datasets.common import LoadedDataset, column, load_raw_rows, to_common_math_form

NAME = "local"


def load_local_math(
    data_path: str | None = None,
    problem_key: str = "problem",
    solution_key: str = "answer",
    file_format: str | None = None,
) -> LoadedDataset:
    """Rows of ``data_path`` in the common math form (a missing column or empty field names the row and field);
    ``file_format``: read it as that format whatever its extension."""
    if data_path is None:
        raise DataError(f"{NAME}: data_path is required (a local .jsonl/.json/.parquet/.csv file)")
    raw = load_raw_rows(NAME, hub_id="", hub_split="", data_path=data_path, file_format=file_format)
    rows = to_common_math_form(raw, f"{NAME} ({data_path})", problem=column(problem_key), answer=column(solution_key))
    return LoadedDataset(name=NAME, train=None, validation=rows)
