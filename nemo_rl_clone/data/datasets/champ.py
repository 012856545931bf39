"""Offline SFT and preference sets built from the ``champ_dataset`` package (CHAMP: 270 competition-level math
problems with step-by-step reference solutions and 540 model solutions annotated with their first wrong step).

- SFT row: user = the problem, assistant = the reference steps joined by newlines + ``"The answer is {answer}."``.
- Preference row: context = the problem, chosen = that reference solution, rejected = an annotated model solution
  that has a first wrong step (``start_idx`` set); one pair per such annotation (444 in v0).

Validation holds out a seeded fraction of *problems* (default 10%), so no problem is in both splits, and with the
same seed the SFT and preference sets hold out the same problems. Rows carry ``problem_id``.
"""

from __future__ import annotations

import functools
import json
import random
from importlib import resources
from typing import Any

from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.data.datasets.common import LoadedDataset

DATA_FILE = ("dataset_files", "v0.json")
DEFAULT_SPLIT_VALIDATION_SIZE = 0.1


@functools.cache
def load_champ_problems() -> dict[str, dict[str, Any]]:
    """``problem id → problem`` from the package's ``v0.json`` (``_text`` fields: the text without ``@@`` marks)."""
    path = resources.files("champ_dataset").joinpath(*DATA_FILE)
    problems = json.loads(path.read_text(encoding="utf-8"))["problems"]
    if not problems:
        raise DataError(f"champ_dataset: {path} has no problems")
    return problems


def reference_solution(problem: dict[str, Any]) -> str:
    """The reference steps, one per line, then the final answer."""
    steps = [step["_text"].strip() for step in problem["solution"]["steps"]]
    return "\n".join([*steps, f"The answer is {problem['_answer'].strip()}."])


def champ_sft_row(problem_id: str, problem: dict[str, Any]) -> dict[str, Any]:
    return {
        "problem_id": problem_id,
        "messages": [
            {"role": "user", "content": problem["_text"]},
            {"role": "assistant", "content": reference_solution(problem)},
        ],
    }


def champ_preference_rows(problem_id: str, problem: dict[str, Any]) -> list[dict[str, Any]]:
    """One pair per annotated model solution with a first wrong step, in annotation-key order."""
    chosen = [{"role": "assistant", "content": reference_solution(problem)}]
    rows = []
    for _, annotation in sorted(problem.get("fws_annotations", {}).items()):
        if annotation.get("start_idx") is None or not annotation.get("text", "").strip():
            continue
        rows.append(
            {
                "problem_id": problem_id,
                "context": [{"role": "user", "content": problem["_text"]}],
                "chosen": chosen,
                "rejected": [{"role": "assistant", "content": annotation["text"]}],
            }
        )
    return rows


def split_problem_ids(
    problem_ids: list[str], split_validation_size: float | None, seed: int
) -> tuple[list[str], list[str]]:
    """``(train ids, validation ids)``: a seeded hold-out of ``split_validation_size`` (null: 10%) of the problems."""
    size = DEFAULT_SPLIT_VALIDATION_SIZE if split_validation_size is None else split_validation_size
    if not 0.0 <= size < 1.0:
        raise DataError(f"champ: split_validation_size must be in [0, 1), got {size}")
    ids = sorted(problem_ids)
    num_val = round(size * len(ids))
    if size > 0 and num_val < 1:
        raise DataError(f"champ: split_validation_size={size} of {len(ids)} problems leaves no validation problem")
    held_out = set(random.Random(seed).sample(ids, num_val))
    return [i for i in ids if i not in held_out], [i for i in ids if i in held_out]


def load_champ_sft(split_validation_size: float | None = None, seed: int = 42) -> LoadedDataset:
    """SFT rows, one per problem."""
    problems = load_champ_problems()
    train_ids, val_ids = split_problem_ids(list(problems), split_validation_size, seed)
    train = [champ_sft_row(i, problems[i]) for i in train_ids]
    validation = [champ_sft_row(i, problems[i]) for i in val_ids] or None
    return LoadedDataset(name="champ", train=train, validation=validation)


def load_champ_preference(split_validation_size: float | None = None, seed: int = 42) -> LoadedDataset:
    """Preference rows, one per wrong annotated solution; problems without one contribute no pair."""
    problems = load_champ_problems()
    train_ids, val_ids = split_problem_ids(list(problems), split_validation_size, seed)
    train = [row for i in train_ids for row in champ_preference_rows(i, problems[i])]
    validation = [row for i in val_ids for row in champ_preference_rows(i, problems[i])] or None
    return LoadedDataset(name="champ", train=train, validation=validation)
