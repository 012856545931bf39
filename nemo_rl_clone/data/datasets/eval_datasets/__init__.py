"""Evaluation sets at NeMo-RL v0.7.0's path (``nemo_rl.data.datasets.eval_datasets``): `load_eval_dataset` turns an
evaluation config's ``data`` section into NeMo-RL's dataset object (``rekeyed_ds``, ``task_spec``, ``processor``,
``preprocessor``), on this library's loaders (`data.datasets`), so that ``examples/run_eval.py`` and NeMo-RL's script
read the same rows.

``dataset_name`` is a built-in evaluation set (aime2024, math500, gsm8k, reasoning_gym, human_eval), one of NeMo-RL's
sets read from their own sources (`sources`: math, mmlu, mmlu_<LANG>, mmlu_pro, gpqa, gpqa_diamond), ``local`` with
``data_path``, or — NeMo-RL's form — the path or URL of the file itself, read with ``problem_key``, ``solution_key``
and ``file_format``. The multiple-choice sets are processed by `multichoice_qa_processor`, their prompt file being an
instruction placed before the question and its options (not a ``{}`` template).

NeMo-RL's per-set classes live in the submodules (``aime``, ``math``, ``mmlu``, ``mmlu_pro``, ``gpqa``,
``local_math_dataset``): each builds the same object from NeMo-RL's arguments. The audio set (``mmau``) and AIME
2025 / 2026 are refused by name.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nemo_rl_clone.data.datasets import DATASET_NAMES, DataError, unknown_dataset_message
from nemo_rl_clone.data.datasets.eval_datasets.sources import (
    DEFAULT_PROMPTS,
    MULTICHOICE_DATASETS,
    SOURCE_DATASETS,
    load_source_rows,
)
from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.utils.lazy_exports import lazy_getattr

if TYPE_CHECKING:  # torch loads with the data interfaces: not when a config is validated
    from nemo_rl_clone.data.interfaces import TaskDataSpec

__all__ = [
    "EVAL_DATASET_NAMES",
    "MULTICHOICE_DATASETS",
    "MULTIMODAL_DATASETS",
    "EvalDataset",
    "_is_multimodal_dataset",
    "load_eval_dataset",
]

# NeMo-RL's classes, loaded on first use: name → submodule.
__getattr__ = lazy_getattr(
    __name__,
    {
        "AIMEDataset": "aime",
        "AIMEVariant": "aime",
        "GPQADataset": "gpqa",
        "LocalMathDataset": "local_math_dataset",
        "MathDataset": "math",
        "MMLUDataset": "mmlu",
        "MMLUProDataset": "mmlu_pro",
    },
)

# Dataset names that need a multimodal processor (NeMo-RL's audio set); refused here: text-only models.
MULTIMODAL_DATASETS = {"mmau", "TwinkStart/MMAU"}
LOCAL_DATASET = "local"
# Made for training only: evaluating on them would mean their (hub) training split.
_TRAINING_ONLY = ("OpenMathInstruct-2", "DeepScaler", "DAPOMath17K")
EVAL_DATASET_NAMES = (*(name for name in DATASET_NAMES if name not in _TRAINING_ONLY), *SOURCE_DATASETS)
# NeMo-RL's evaluation sets not built here (hub copies of other years of AIME).
NOT_SHIPPED = ("aime2025", "aime2026")
FILE_FORMATS = ("csv", "json", "jsonl", "parquet")
# The environment that scores each set (math when not listed).
_ENVIRONMENTS = {"reasoning_gym": "reasoning_gym", "human_eval": "code"}


def _is_multimodal_dataset(dataset_name: str) -> bool:
    """Whether NeMo-RL processes ``dataset_name`` with a multimodal processor (``get_tokenizer(get_processor=...)``)."""
    return dataset_name in MULTIMODAL_DATASETS


def is_data_file(name: str) -> bool:
    """A path or URL of a data file (NeMo-RL's local evaluation form), not a dataset name."""
    return name.rsplit(".", 1)[-1].lower() in FILE_FORMATS and ("/" in name or "." in name)


@dataclass
class EvalDataset:
    """NeMo-RL's evaluation dataset object: ``rekeyed_ds`` (rows ``{"problem", "expected_answer", "task_name"}``, or
    the set's own form), ``task_spec`` (the prompt files), ``processor`` (row → prompt datum), no ``preprocessor``."""

    rekeyed_ds: Any
    task_spec: TaskDataSpec
    processor: Callable[..., Any]
    preprocessor: Callable[[Any], Any] | None = None


def load_eval_dataset(data_config: Mapping[str, Any], seed: int = 42) -> EvalDataset:
    """The evaluation rows the ``data`` section names (a dict with NeMo-RL's keys: ``dataset_name``,
    ``prompt_file``, ``system_prompt_file``, ``data_path``, and for a file ``problem_key``, ``solution_key``,
    ``file_format``, ``split``). ``seed`` seeds generated sets (reasoning_gym's own section has its seed too) and
    GPQA's order of choices."""
    from nemo_rl_clone.data.interfaces import TaskDataSpec
    from nemo_rl_clone.data.processors import DATA_PROCESSORS

    name = data_config.get("dataset_name")
    name = os.fspath(name) if isinstance(name, os.PathLike) else name  # a file's path may be a pathlib.Path
    if not isinstance(name, str) or not name:
        raise UserInputError("data.dataset_name: required (an evaluation set's name, or a data file's path)")
    task = _ENVIRONMENTS.get(name, "math")
    rows = _eval_rows(name, data_config, seed)
    prompt_file, system_prompt_file = data_config.get("prompt_file"), data_config.get("system_prompt_file")
    if name in MULTICHOICE_DATASETS:
        from nemo_rl_clone.data.nemo_rl_processors import multichoice_qa_processor

        spec = _multichoice_spec(name, task, prompt_file, system_prompt_file)
        return EvalDataset(rekeyed_ds=rows, task_spec=spec, processor=multichoice_qa_processor)
    spec = TaskDataSpec(task, prompt_file, system_prompt_file)
    return EvalDataset(rekeyed_ds=rows, task_spec=spec, processor=DATA_PROCESSORS[task])


def _multichoice_spec(name: str, task: str, prompt_file: Any, system_prompt_file: Any) -> TaskDataSpec:
    """The prompt of a multiple-choice set: ``prompt_file``'s text, or the set's default instruction (GPQA,
    MMLU-Pro; MMLU has none), placed before the question and options by `multichoice_qa_processor`."""
    from nemo_rl_clone.data.interfaces import TaskDataSpec, resolve_prompt_path

    spec = TaskDataSpec(task, system_prompt_file=system_prompt_file)
    if prompt_file is None:
        spec.prompt = DEFAULT_PROMPTS.get(name)
        return spec
    try:
        text = resolve_prompt_path(os.fspath(prompt_file)).read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise FileNotFoundError(f"prompt_file: {err}") from None
    if "{}" in text:  # e.g. the default cot.txt: its "{}" would reach the model as is, and it asks for \boxed{}
        raise UserInputError(
            f"data.prompt_file: {os.fspath(prompt_file)!r} is a '{{}}' template; {name!r} is multiple-choice: its "
            "prompt is an instruction placed before the question and options (e.g. examples/prompts/mmlu.txt), "
            "or null for the set's default"
        )
    # Set after construction: TaskDataSpec checks for the '{}' placeholder that a multiple-choice prompt lacks.
    spec.prompt_file, spec.prompt = os.fspath(prompt_file), text
    return spec


def _eval_rows(name: str, data_config: Mapping[str, Any], seed: int) -> Any:
    from nemo_rl_clone.data.config import DataConfig
    from nemo_rl_clone.data.datasets import load_dataset_from_config
    from nemo_rl_clone.data.datasets.local_math import load_local_math

    if _is_multimodal_dataset(name):
        raise UserInputError(f"data.dataset_name: not supported yet: {name!r} (audio inputs; text-only models here)")
    if name in NOT_SHIPPED:
        raise UserInputError(
            f"data.dataset_name: not supported yet: NeMo-RL's {name!r} evaluation set; built here: "
            f"{', '.join(EVAL_DATASET_NAMES)} (or a data file's path)"
        )
    if (split := data_config.get("split")) and split != "train":
        raise UserInputError(f"data.split: not supported yet: {split!r}; a local file has one split, 'train'")
    data_path = data_config.get("data_path")
    if name in SOURCE_DATASETS:
        rows = load_source_rows(name, None if data_path is None else os.fspath(data_path), seed)
        if not len(rows):
            raise DataError(f"data.dataset_name: {name!r} gave no evaluation rows")
        return rows
    if name != LOCAL_DATASET and name not in EVAL_DATASET_NAMES:
        if not is_data_file(name):
            raise DataError(f"data.dataset_name: {unknown_dataset_message(name, EVAL_DATASET_NAMES)}")
        name, data_path = LOCAL_DATASET, name
    if name == LOCAL_DATASET:
        loaded = load_local_math(
            data_path=None if data_path is None else str(data_path),
            problem_key=data_config.get("problem_key") or "problem",
            solution_key=data_config.get("solution_key") or "answer",
            file_format=data_config.get("file_format"),
        )
    else:
        section = DataConfig(
            dataset_name=name,
            data_path=None if data_path is None else str(data_path),
            reasoning_gym=_reasoning_gym_section(data_config.get("reasoning_gym")),
        )
        loaded = load_dataset_from_config(section, seed=seed)
    if not loaded.validation:
        raise DataError(f"data.dataset_name: {name!r} gave no evaluation rows")
    return loaded.validation


def _reasoning_gym_section(section: Any) -> Any:
    if section is None or not isinstance(section, Mapping):
        return section  # typed already (this library's config), or absent
    from nemo_rl_clone.data.config import ReasoningGymDataConfig
    from nemo_rl_clone.utils.config_validation import as_config

    return as_config(section, ReasoningGymDataConfig, key="data.reasoning_gym")
