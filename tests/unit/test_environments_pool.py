"""VerifierPool failure handling with real Ray actors: a verifier that raises, one that hangs, one that dies.

The verifier classes are built inside a function so that Ray pickles them by value: workers cannot import this
test module by name.
"""

from __future__ import annotations

import os

import pytest
import ray

from nemo_rl_clone.environments.verifier_pool import VerifierPool, VerifierResult, batch_reward_metrics


def _faulty_verifier_class() -> type:
    class FaultyVerifier:
        """Echoes a job's number as the reward; ``raise``, ``hang`` and ``die`` misbehave as named."""

        def __init__(self, fail_on_start: bool = False):
            if fail_on_start:
                raise RuntimeError("missing verifier dependency")

        def score(self, job: str) -> VerifierResult:
            if job == "raise":
                raise ArithmeticError("verifier bug")
            if job == "hang":
                import time

                time.sleep(3600)
            if job == "die":
                os._exit(1)
            return VerifierResult(float(job), job)

        def pid(self) -> int:
            return os.getpid()

    return FaultyVerifier


@pytest.fixture(scope="module")
def pool(ray_local: None):
    pool = VerifierPool(_faulty_verifier_class(), (), num_workers=2, timeout_s=2.0)
    yield pool
    pool.shutdown()


def test_scores_in_job_order(pool: VerifierPool) -> None:
    jobs = [("1",), ("0",), ("0.5",), ("1",), ("0",)]
    results = pool.score(jobs)
    assert [result.reward for result in results] == [1.0, 0.0, 0.5, 1.0, 0.0]
    assert [result.answer for result in results] == ["1", "0", "0.5", "1", "0"]
    assert all(result.status == "ok" for result in results)


def test_a_raising_verifier_scores_zero_and_the_rest_go_on(pool: VerifierPool) -> None:
    replacements = pool.num_replacements
    results = pool.score([("1",), ("raise",), ("1",)])
    assert [result.reward for result in results] == [1.0, 0.0, 1.0]
    assert results[1].status == "error"
    assert "ArithmeticError: verifier bug" in results[1].error
    assert pool.num_replacements == replacements  # an exception does not cost the actor


def test_a_hanging_verifier_is_killed_replaced_and_scores_zero(pool: VerifierPool) -> None:
    replacements = pool.num_replacements
    pids_before = set(ray.get([worker.pid.remote() for worker in pool.workers]))
    results = pool.score([("hang",), ("1",), ("1",), ("0",)])
    assert [result.reward for result in results] == [0.0, 1.0, 1.0, 0.0]
    assert [result.status for result in results] == ["timeout", "ok", "ok", "ok"]
    assert pool.num_replacements == replacements + 1
    pids_after = set(ray.get([worker.pid.remote() for worker in pool.workers]))
    assert len(pids_before - pids_after) == 1  # exactly the hung process was replaced
    assert [result.reward for result in pool.score([("1",), ("1",)])] == [1.0, 1.0]


def test_a_dying_verifier_is_replaced_and_its_job_retried_once(pool: VerifierPool) -> None:
    replacements = pool.num_replacements
    # "die" kills whichever verifier takes it, and again on the retry: it scores 0 as crashed.
    results = pool.score([("die",), ("1",), ("0.25",)])
    assert [result.reward for result in results] == [0.0, 1.0, 0.25]
    assert results[0].status == "crashed"
    assert pool.num_replacements == replacements + 2


def test_a_killed_idle_verifier_is_replaced_without_losing_the_job(pool: VerifierPool) -> None:
    replacements = pool.num_replacements
    ray.kill(pool.workers[0])
    results = pool.score([("1",), ("1",), ("1",)])
    assert [(result.reward, result.status) for result in results] == [(1.0, "ok")] * 3
    assert pool.num_replacements == replacements + 1


def test_bad_pool_arguments(ray_local: None) -> None:
    with pytest.raises(ValueError, match="num_workers must be >= 1, got 0"):
        VerifierPool(_faulty_verifier_class(), (), num_workers=0, timeout_s=1.0)
    with pytest.raises(ValueError, match="timeout_s must be > 0, got 0"):
        VerifierPool(_faulty_verifier_class(), (), num_workers=1, timeout_s=0)


def test_a_verifier_that_cannot_start_raises_a_clear_error(ray_local: None) -> None:
    with pytest.raises(
        RuntimeError,
        match=r"(?s)verifier actor 0 failed to start 3 times in a row; last error: .*missing verifier dependency",
    ):
        VerifierPool(_faulty_verifier_class(), (True,), num_workers=1, timeout_s=1.0)


def test_batch_reward_metrics_by_hand() -> None:
    metrics = batch_reward_metrics(
        {
            "rewards": [1.0, 0.0, 0.5, 1.0],
            "is_end": [True, True, False, True],
            "generation_lengths": [10, 20, 30, 50],
            "prompt_lengths": [4, 4, 6, 6],
        }
    )
    assert metrics == {
        "accuracy": 0.5,  # only reward 1 counts as correct; 0.5 is partial credit
        "mean_reward": 0.625,
        "num_samples": 4.0,
        "fraction_of_samples_properly_ended": 0.75,
        "generation_lengths": 27.5,
        "correct_solution_generation_lengths": 30.0,
        "prompt_lengths": 5.0,
    }
    with pytest.raises(KeyError, match=r"needs 'rewards' \(float\[B\]\).*it has \['text'\]"):
        batch_reward_metrics({"text": ["a"]})
    with pytest.raises(ValueError, match="batch\\['rewards'\\] is empty"):
        batch_reward_metrics({"rewards": []})
