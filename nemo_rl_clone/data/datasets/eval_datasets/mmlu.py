"""NeMo-RL's ``MMLUDataset`` evaluation class: MMLU in one language from OpenAI's simple-evals CSVs (`load_eval_dataset`'s
``mmlu`` for EN-US, ``mmlu_<LANG>`` for the others), as multiple-choice rows. No default prompt: ``prompt_file``."""

from __future__ import annotations

from nemo_rl_clone.data.datasets.eval_datasets import EvalDataset, load_eval_dataset
from nemo_rl_clone.data.datasets.eval_datasets.sources import mmlu_dataset_name


class MMLUDataset(EvalDataset):
    """``rekeyed_ds`` (``question``, ``options`` A-D, ``answer``, ``subject``), ``task_spec`` from the prompt files,
    the ``multichoice_qa_processor``."""

    def __init__(
        self, language: str = "EN-US", prompt_file: str | None = None, system_prompt_file: str | None = None
    ) -> None:
        loaded = load_eval_dataset(
            {
                "dataset_name": mmlu_dataset_name(language),
                "prompt_file": prompt_file,
                "system_prompt_file": system_prompt_file,
            }
        )
        super().__init__(loaded.rekeyed_ds, loaded.task_spec, loaded.processor)
