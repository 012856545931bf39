"""NeMo-RL's ``GPQADataset`` evaluation class: GPQA ``main`` (`load_eval_dataset`'s ``gpqa``) or ``diamond``
(``gpqa_diamond``) from ``Idavidrein/gpqa``, as multiple-choice rows.

Each row's four choices are shuffled with a ``random.Random`` seeded by the evaluation seed (42 here, NeMo-RL's
signature has no seed; ``load_eval_dataset(..., seed)`` takes ``eval.seed``), so the letters are the same in every
run; NeMo-RL shuffles with an unseeded generator.
"""

from __future__ import annotations

from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.data.datasets.eval_datasets import EvalDataset, load_eval_dataset
from nemo_rl_clone.data.datasets.eval_datasets.sources import GPQA_VARIANTS


class GPQADataset(EvalDataset):
    """``rekeyed_ds`` (``question``, ``options`` A-D, ``answer``), ``task_spec`` from the prompt files (GPQA's
    instruction when ``prompt_file`` is None), the ``multichoice_qa_processor``."""

    def __init__(
        self, variant: str = "diamond", prompt_file: str | None = None, system_prompt_file: str | None = None
    ) -> None:
        if variant not in GPQA_VARIANTS:
            raise DataError(f"variant: {variant!r} is not a GPQA set; use one of {list(GPQA_VARIANTS)}")
        loaded = load_eval_dataset(
            {
                "dataset_name": "gpqa" if variant == "main" else "gpqa_diamond",
                "prompt_file": prompt_file,
                "system_prompt_file": system_prompt_file,
            }
        )
        super().__init__(loaded.rekeyed_ds, loaded.task_spec, loaded.processor)
