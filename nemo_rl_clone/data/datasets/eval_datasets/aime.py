"""NeMo-RL's ``AIMEDataset`` evaluation class: the AIME set of one year, as `load_eval_dataset` loads
``aime<year>`` (2024 is built here; 2025 and 2026 are refused by name)."""

from __future__ import annotations

from typing import Literal

from nemo_rl_clone.data.datasets.eval_datasets import EvalDataset, load_eval_dataset

AIMEVariant = Literal["2024", "2025", "2026"]


class AIMEDataset(EvalDataset):
    """``rekeyed_ds`` (``problem``, ``expected_answer``), ``task_spec`` from the prompt files, the math
    ``processor``."""

    def __init__(
        self, variant: AIMEVariant = "2025", prompt_file: str | None = None, system_prompt_file: str | None = None
    ) -> None:
        loaded = load_eval_dataset(
            {"dataset_name": f"aime{variant}", "prompt_file": prompt_file, "system_prompt_file": system_prompt_file}
        )
        super().__init__(loaded.rekeyed_ds, loaded.task_spec, loaded.processor)
