"""NeMo-RL's ``PreferenceDataset``: rows already in its preference form (``context`` messages and ranked
``completions``), from a local file or a hub dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemo_rl_clone.data.datasets.raw_dataset import RawDataset, task_name_from_path
from nemo_rl_clone.data.datasets.utils import load_dataset_from_path


class PreferenceDataset(RawDataset):
    """Rows ``{"context": [...], "completions": [{"rank": 0, "completion": [...]}, ...]}`` (lower rank preferred),
    kept as written plus ``task_name`` (the file's folder and name)."""

    def __init__(self, data_path: str | Path, subset: str | None = None, split: str | None = None, **kwargs: Any):
        self.task_name = task_name_from_path(data_path)
        rows = load_dataset_from_path(data_path, subset, split)
        self.dataset = rows.add_column("task_name", [self.task_name] * len(rows))
        self.val_dataset = None
