"""`ReasoningGymEnvironment`: reasoning-gym tasks scored by each task's own ``score_answer``.

Per-sample metadata (built by the data side from ``reasoning_gym.create_dataset(task, seed=..., size=...,
**task_kwargs)``):
- ``task``: a registered reasoning-gym task name (``reasoning_gym.factory.DATASETS``), e.g. ``"chain_sum"``;
- ``entry``: the dataset entry (``{"question", "answer", "metadata"}``) the prompt came from;
- ``task_kwargs`` (optional): the kwargs the dataset was built with. A few scorers read the dataset config (e.g.
  ``puzzle24`` checks the allowed number range), so the scorer is built from the same kwargs; without them it uses
  the task's defaults. Seed and size do not affect scoring.

Reward = ``score_answer(extracted_answer, entry)`` in [0, 1]. Partial credit is kept: many scorers give
``len(oracle) / len(answer)`` when the oracle is a substring of the answer (answer ``"16"`` for oracle ``"6"`` scores
0.5), and some grade closeness. Accuracy metrics count only reward 1. No extracted answer scores 0 (the scorer is
still asked, with ``None``).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from typing import Any

import ray

from nemo_rl_clone.environments.answer_extraction import extract_answer
from nemo_rl_clone.environments.config import ReasoningGymEnvConfig, check_env_config
from nemo_rl_clone.environments.verifier_pool import VerifierPoolEnvironment, VerifierResult


def registered_tasks() -> list[str]:
    """Names of every task reasoning-gym registers (sorted)."""
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def resolve_task(name: str) -> str:
    """``name`` if reasoning-gym registers it; otherwise ValueError naming the closest registered tasks."""
    tasks = registered_tasks()
    if name in tasks:
        return name
    close = difflib.get_close_matches(str(name), tasks, n=5, cutoff=0.5)
    hint = f"close matches: {', '.join(close)}" if close else "no close match"
    raise ValueError(f"unknown reasoning-gym task {name!r} ({hint}); reasoning-gym registers {len(tasks)} tasks")


def build_scorer(task: str, task_kwargs: Mapping[str, Any]) -> Any:
    """The reasoning-gym dataset whose ``score_answer`` scores ``task`` entries built with ``task_kwargs``."""
    import reasoning_gym

    task = resolve_task(task)
    try:
        return reasoning_gym.create_dataset(task, **dict(task_kwargs))
    except (TypeError, AssertionError, ValueError) as error:  # unknown kwarg / a config's own validate()
        raise ValueError(f"reasoning-gym task {task!r} rejects task_kwargs {dict(task_kwargs)!r}: {error}") from error


class ReasoningGymScorer:
    """One scorer process (run as a Ray actor by `VerifierPool`); caches one dataset per (task, kwargs)."""

    def __init__(self, answer_extraction: str):
        extract_answer("", answer_extraction)  # rejects an unknown method before the first response
        self._answer_extraction = answer_extraction
        self._scorers: dict[str, Any] = {}
        # Importing reasoning-gym (every task module) takes ~1 s idle and several under load: pay it here, inside
        # the pool's start-up limit, not inside the first response's deadline, where it scored correct answers 0.
        self.score("<answer>2</answer>", "chain_sum", {"question": "1 + 1", "answer": "2", "metadata": {}}, {})

    def score(self, response: str, task: str, entry: dict[str, Any], task_kwargs: dict[str, Any]) -> VerifierResult:
        key = _scorer_key(task, task_kwargs)
        if key not in self._scorers:
            self._scorers[key] = build_scorer(task, task_kwargs)
        answer = extract_answer(response, self._answer_extraction)
        reward = float(self._scorers[key].score_answer(answer, entry))
        if not 0.0 <= reward <= 1.0:  # a scorer bug must not leak out-of-range rewards into training
            raise ValueError(f"reasoning-gym scorer for {task!r} returned {reward}, outside [0, 1]")
        return VerifierResult(reward, answer)


@ray.remote(max_restarts=-1, max_task_retries=-1)  # a crashed environment restarts; in-flight steps are retried
class ReasoningGymEnvironment(VerifierPoolEnvironment):
    """Reasoning-gym environment actor over ``cfg.num_workers`` `ReasoningGymScorer` actors.

    Scorers run in their own processes under ``cfg.verifier_timeout_s``: some evaluate model text (``eval`` in
    ``n_queens``, ``binary_matrix``), which can hang; such a response scores 0.
    """

    def __init__(self, cfg: ReasoningGymEnvConfig):
        check_env_config("reasoning_gym", cfg)
        self._validated: set[str] = set()
        super().__init__(ReasoningGymScorer, (cfg.answer_extraction,), cfg.num_workers, cfg.verifier_timeout_s)

    def make_job(self, response: str, metadata: Mapping[str, Any], sample_index: int) -> tuple[Any, ...]:
        missing = [key for key in ("task", "entry") if key not in metadata]
        if missing:
            raise ValueError(
                f"sample {sample_index}: reasoning-gym metadata needs {missing}; it has {sorted(metadata)} "
                "(expected {'task': name, 'entry': reasoning-gym entry, 'task_kwargs': optional dict})"
            )
        task, entry, task_kwargs = metadata["task"], metadata["entry"], metadata.get("task_kwargs") or {}
        if not isinstance(entry, Mapping) or "answer" not in entry:
            raise ValueError(f"sample {sample_index}: 'entry' must be a reasoning-gym entry dict with an 'answer'")
        if not isinstance(task_kwargs, Mapping):
            raise TypeError(f"sample {sample_index}: 'task_kwargs' must be a dict, got {type(task_kwargs).__name__}")
        key = _scorer_key(task, task_kwargs)
        if key not in self._validated:  # fail the step on a data bug rather than score every sample 0
            try:
                build_scorer(task, task_kwargs)
            except ValueError as error:
                raise ValueError(f"sample {sample_index}: {error}") from error
            self._validated.add(key)
        return (response, task, dict(entry), dict(task_kwargs))


def _scorer_key(task: str, task_kwargs: Mapping[str, Any]) -> str:
    return json.dumps([task, dict(task_kwargs)], sort_keys=True, default=repr)
