"""MATH-500 (``HuggingFaceH4/MATH-500``, split ``test``): columns ``problem``, ``solution``, ``answer``, ``subject``,
``level``, ``unique_id``. An evaluation set: rows are returned as ``validation``."""

from __future__ import annotations

from nemo_rl_clone.data.datasets.common import LoadedDataset, column, load_raw_rows, to_common_math_form

NAME = "math500"
HUB_ID = "HuggingFaceH4/MATH-500"
HUB_SPLIT = "test"


def load_math500(data_path: str | None = None) -> LoadedDataset:
    """Load MATH-500 in the common form (from the hub, or ``data_path``: a local file in the hub format)."""
    raw = load_raw_rows(NAME, HUB_ID, HUB_SPLIT, data_path)
    rows = to_common_math_form(
        raw, f"{NAME} ({data_path or HUB_ID})", problem=column("problem"), answer=column("answer")
    )
    return LoadedDataset(name=NAME, train=None, validation=rows)
