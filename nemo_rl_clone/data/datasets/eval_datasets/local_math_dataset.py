"""NeMo-RL's ``LocalMathDataset`` evaluation class: math problems from a local file (or URL), read with
``problem_key`` and ``solution_key`` as `load_eval_dataset` reads ``local``."""

from __future__ import annotations

from pathlib import Path

from nemo_rl_clone.data.datasets.eval_datasets import LOCAL_DATASET, EvalDataset, load_eval_dataset


class LocalMathDataset(EvalDataset):
    """``rekeyed_ds`` (``problem``, ``expected_answer``), ``task_spec`` from the prompt files, the math
    ``processor``. ``split``: a file has one, ``train``."""

    def __init__(
        self,
        data_path: str | Path,
        problem_key: str,
        solution_key: str,
        split: str | None = None,
        file_format: str = "csv",
        prompt_file: str | None = None,
        system_prompt_file: str | None = None,
    ) -> None:
        loaded = load_eval_dataset(
            {
                "dataset_name": LOCAL_DATASET,
                "data_path": data_path,
                "problem_key": problem_key,
                "solution_key": solution_key,
                "split": split,
                "file_format": file_format,
                "prompt_file": prompt_file,
                "system_prompt_file": system_prompt_file,
            }
        )
        super().__init__(loaded.rekeyed_ds, loaded.task_spec, loaded.processor)
