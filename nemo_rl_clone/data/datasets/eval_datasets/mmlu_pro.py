"""NeMo-RL's ``MMLUProDataset`` evaluation class: ``TIGER-Lab/MMLU-Pro`` (split ``test``; `load_eval_dataset`'s
``mmlu_pro``), as multiple-choice rows with up to ten options (A-J)."""

from __future__ import annotations

from nemo_rl_clone.data.datasets.eval_datasets import EvalDataset, load_eval_dataset


class MMLUProDataset(EvalDataset):
    """``rekeyed_ds`` (``question``, ``options`` A-J, ``answer``, ``subject`` = the category), ``task_spec`` from the
    prompt files (MMLU-Pro's instruction when ``prompt_file`` is None), the ``multichoice_qa_processor``."""

    def __init__(self, prompt_file: str | None, system_prompt_file: str | None = None) -> None:
        loaded = load_eval_dataset(
            {"dataset_name": "mmlu_pro", "prompt_file": prompt_file, "system_prompt_file": system_prompt_file}
        )
        super().__init__(loaded.rekeyed_ds, loaded.task_spec, loaded.processor)
