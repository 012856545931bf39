"""reasoning-gym task sets, generated offline: ``reasoning_gym.create_dataset(task, size, seed, **task_kwargs)``.

Rows: ``{"problem", "expected_answer", "task_name": "reasoning_gym", "extra_env_info": {"task", "entry"}}``; the
environment scores an answer with the task's own scorer on ``entry``.

Seeding: reasoning-gym draws item ``i`` of a dataset seeded ``s`` from ``Random(s + i)``, so datasets with seeds
``s`` and ``s + 1`` share all but one item. Training items therefore use seeds ``seed + i`` (``i < train_size``),
validation candidates ``seed + train_size + j``, and validation keeps only questions that occur neither in the
training set nor earlier in validation: the two sets never share a question.
"""

from __future__ import annotations

import difflib
from typing import Any, Optional

import reasoning_gym
from reasoning_gym.factory import DATASETS as TASKS

from nemo_rl_clone.data.datasets.common import LoadedDataset

NAME = "reasoning_gym"
TASK_NAME = "reasoning_gym"
# Validation candidates examined per wanted validation item before giving up (tiny task spaces run out).
_CANDIDATES_PER_VAL_ITEM = 20

# FINDINGS: SmolLM2-135M-Instruct only uses the <answer> tag when shown an example of it in the prompt.
ONE_SHOT_TEMPLATE = (
    "Answer the question. Put only the final answer inside <answer></answer> tags.\n\n"
    "Example:\nQuestion: {example_question}\nAnswer: <answer>{example_answer}</answer>\n\n"
    "Question: {question}\nAnswer:"
)


def load_reasoning_gym(
    task: str,
    task_kwargs: Optional[dict[str, Any]] = None,
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
        val_size: number of validation rows; all distinct and absent from the training rows.
        seed: base seed (see module docstring).
        one_shot_example: prefix every question with one solved example of the same task in the ``<answer>``
            format (:data:`ONE_SHOT_TEMPLATE`); the example is not a validation question.
    """
    if task not in TASKS:
        near = difflib.get_close_matches(task, list(TASKS), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ValueError(f"{NAME}: unknown task {task!r}{hint}; valid tasks: {', '.join(sorted(TASKS))}")
    if train_size < 1 or val_size < 0:
        raise ValueError(f"{NAME}: need train_size >= 1 and val_size >= 0, got {train_size} and {val_size}")
    kwargs = dict(task_kwargs or {})

    train_entries = list(_generate(task, kwargs, seed, train_size))
    train_questions = {entry["question"] for entry in train_entries}
    val_entries = _distinct_entries(task, kwargs, seed + train_size, val_size, exclude=train_questions)

    example = None
    if one_shot_example:
        val_questions = {entry["question"] for entry in val_entries}
        example_seed = seed + train_size + _CANDIDATES_PER_VAL_ITEM * max(val_size, 1)
        example = _distinct_entries(task, kwargs, example_seed, 1, exclude=val_questions)[0]
    return LoadedDataset(
        name=NAME,
        train=[_row(task, entry, example) for entry in train_entries],
        validation=[_row(task, entry, example) for entry in val_entries],
    )


def _generate(task: str, kwargs: dict[str, Any], seed: int, size: int) -> Any:
    try:
        return reasoning_gym.create_dataset(task, size=size, seed=seed, **kwargs)
    except (TypeError, ValueError, AssertionError) as err:
        raise ValueError(f"{NAME}: cannot create task {task!r} with task_kwargs {kwargs}: {err}") from err


def _distinct_entries(
    task: str, kwargs: dict[str, Any], seed: int, count: int, exclude: set[str]
) -> list[dict[str, Any]]:
    """``count`` entries with distinct questions not in ``exclude``, scanning a bounded candidate stream."""
    candidates = _generate(task, kwargs, seed, _CANDIDATES_PER_VAL_ITEM * max(count, 1))
    seen = set(exclude)
    picked: list[dict[str, Any]] = []
    for entry in candidates:
        if len(picked) == count:
            break
        if entry["question"] not in seen:
            seen.add(entry["question"])
            picked.append(entry)
    if len(picked) < count:
        raise ValueError(
            f"{NAME}: task {task!r} with task_kwargs {kwargs} yielded only {len(picked)} of {count} distinct questions "
            f"outside the training set in {len(candidates)} draws; lower val_size or train_size, or widen the task"
        )
    return picked


def _row(task: str, entry: dict[str, Any], example: Optional[dict[str, Any]]) -> dict[str, Any]:
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
