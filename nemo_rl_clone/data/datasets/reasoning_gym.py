"""reasoning-gym task sets, generated offline: ``reasoning_gym.create_dataset(task, size, seed, **task_kwargs)``.

Rows: ``{"problem", "expected_answer", "task_name": "reasoning_gym", "extra_env_info": {"task", "entry"}}``; the
environment scores an answer with the task's own scorer on ``entry``.

Seeding: reasoning-gym draws item ``i`` of a dataset seeded ``s`` from ``Random(s + i)``, so datasets with seeds
``s`` and ``s + 1`` share all but one item. Validation is drawn first, from seeds ``seed + VAL_SEED_OFFSET + j``,
keeping the first ``val_size`` distinct questions; training draws from seeds ``seed + i`` and skips every validation
question (repeats among training rows are allowed). So the two sets never share a question, and validation is a
plain sample of the task: an earlier version drew validation from what training left over, which in small task
spaces (2-term 1-digit arithmetic has ~2,000 questions) over-represents the rare, harder forms.
"""

from __future__ import annotations

import difflib
from typing import Any

import reasoning_gym
from reasoning_gym.factory import DATASETS as TASKS

from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.data.datasets.common import LoadedDataset

NAME = "reasoning_gym"
TASK_NAME = "reasoning_gym"
# Candidates examined per wanted item before giving up (tiny task spaces run out).
_CANDIDATES_PER_ITEM = 20
# Validation seeds sit far from training seeds, so the validation set does not depend on train_size.
VAL_SEED_OFFSET = 1_000_003

# SmolLM2-135M-Instruct only uses the <answer> tag when shown an example of it in the prompt.
ONE_SHOT_TEMPLATE = (
    "Answer the question. Put only the final answer inside <answer></answer> tags.\n\n"
    "Example:\nQuestion: {example_question}\nAnswer: <answer>{example_answer}</answer>\n\n"
    "Question: {question}\nAnswer:"
)


def load_reasoning_gym(
    task: str,
    task_kwargs: dict[str, Any] | None = None,
    train_size: int = 1000,
    val_size: int = 100,
    seed: int = 42,
    one_shot_example: bool = False,
) -> LoadedDataset:
    """Generate a reasoning-gym task as training and validation rows.

    Args:
        task: a reasoning-gym dataset name (e.g. ``"basic_arithmetic"``).
        task_kwargs: the task's config fields (e.g. ``{"min_terms": 2, "max_terms": 2}``).
        train_size: number of training rows (questions may repeat in small task spaces).
        val_size: number of validation rows: distinct questions, none of them among the training rows.
        seed: base seed (see module docstring).
        one_shot_example: prefix every question with one solved example of the same task in the ``<answer>``
            format (:data:`ONE_SHOT_TEMPLATE`); the example is not a validation question.
    """
    if task not in TASKS:
        near = difflib.get_close_matches(task, list(TASKS), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise DataError(f"{NAME}: unknown task {task!r}{hint}; valid tasks: {', '.join(sorted(TASKS))}")
    if train_size < 1 or val_size < 0:
        raise DataError(f"{NAME}: need train_size >= 1 and val_size >= 0, got {train_size} and {val_size}")
    kwargs = dict(task_kwargs or {})

    val_seed = seed + VAL_SEED_OFFSET
    val_entries = _draw(task, kwargs, val_seed, val_size, exclude=set(), distinct=True, split="validation")
    val_questions = {entry["question"] for entry in val_entries}
    train_entries = _draw(task, kwargs, seed, train_size, exclude=val_questions, distinct=False, split="training")

    example = None
    if one_shot_example:
        example_seed = val_seed + _CANDIDATES_PER_ITEM * max(val_size, 1)
        example = _draw(task, kwargs, example_seed, 1, exclude=val_questions, distinct=True, split="example")[0]
    return LoadedDataset(
        name=NAME,
        train=[_row(task, entry, example) for entry in train_entries],
        validation=[_row(task, entry, example) for entry in val_entries],
    )


def _generate(task: str, kwargs: dict[str, Any], seed: int, size: int) -> Any:
    try:
        return reasoning_gym.create_dataset(task, size=size, seed=seed, **kwargs)
    except (TypeError, ValueError, AssertionError) as err:
        raise DataError(f"{NAME}: cannot create task {task!r} with task_kwargs {kwargs}: {err}") from err


def _draw(
    task: str, kwargs: dict[str, Any], seed: int, count: int, exclude: set[str], distinct: bool, split: str
) -> list[dict[str, Any]]:
    """The first ``count`` entries of the stream seeded ``seed`` whose question is not in ``exclude`` (and, with
    ``distinct``, not drawn before), scanning a bounded number of candidates."""
    if count == 0:
        return []
    candidates = _generate(task, kwargs, seed, _CANDIDATES_PER_ITEM * count)
    seen = set(exclude)
    picked: list[dict[str, Any]] = []
    for entry in candidates:
        if len(picked) == count:
            break
        if entry["question"] not in seen:
            if distinct:
                seen.add(entry["question"])
            picked.append(entry)
    if len(picked) < count:
        raise DataError(
            f"{NAME}: task {task!r} with task_kwargs {kwargs} yielded only {len(picked)} of {count} usable {split} questions "
            f"in {len(candidates)} draws (validation questions are distinct and kept out of training); lower val_size, "
            "or widen the task"
        )
    return picked


def _row(task: str, entry: dict[str, Any], example: dict[str, Any] | None) -> dict[str, Any]:
    problem = entry["question"]
    if example is not None:
        problem = ONE_SHOT_TEMPLATE.format(
            example_question=example["question"], example_answer=example["answer"], question=problem
        )
    return {
        "problem": problem,
        "expected_answer": str(entry["answer"]),
        "task_name": TASK_NAME,
        "extra_env_info": {"task": task, "entry": entry},
    }
