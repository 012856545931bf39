"""NeMo-RL's ``MathDataset`` evaluation class: ``math_test`` is the full MATH test set (`load_eval_dataset`'s
``math``: simple-evals' ``math_test.csv``), ``math_500_test`` is MATH-500 (``math500``)."""

from __future__ import annotations

from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.data.datasets.eval_datasets import EvalDataset, load_eval_dataset

_SETS = {"math_test": "math", "math_500_test": "math500"}


class MathDataset(EvalDataset):
    """``rekeyed_ds`` (``problem``, ``expected_answer``), ``task_spec`` from the prompt files, the math
    ``processor``."""

    def __init__(
        self, variant: str = "math_test", prompt_file: str | None = None, system_prompt_file: str | None = None
    ) -> None:
        if variant not in _SETS:
            raise DataError(f"variant: {variant!r} is not a MATH set; use one of {sorted(_SETS)}")
        loaded = load_eval_dataset(
            {"dataset_name": _SETS[variant], "prompt_file": prompt_file, "system_prompt_file": system_prompt_file}
        )
        super().__init__(loaded.rekeyed_ds, loaded.task_spec, loaded.processor)
