"""A pool of verifier actors with hard per-response timeouts, and the environment base class built on it.

Why separate actors and not threads or a process pool inside the environment actor:
- math-verify's timeouts use ``signal.alarm``, which works only in a process's main thread; in a thread it raises
  ValueError. Methods of a plain Ray actor (``max_concurrency=1``) run in the actor's main thread, so math-verify's
  own timeouts work inside each verifier actor.
- A signal only interrupts Python bytecode: a hang inside C code (a huge integer power, a catastrophic regex) never
  returns. The pool therefore also enforces a wall-clock deadline per response from outside: a verifier that misses
  it is killed (``ray.kill``) and replaced, and that response scores 0.
- A verifier that dies (killed, out of memory, segfault) is replaced and its response retried once on the new
  actor; a second death scores 0. Nothing a single response does can stop the run.

Each verifier scores one response at a time, so a timeout or crash costs only that response's reward.
"""

from __future__ import annotations

import abc
import logging
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import ray
from ray.actor import ActorHandle

from nemo_rl_clone.environments.interfaces import (
    EnvironmentInterface,
    EnvironmentReturn,
    check_step_batch,
    last_assistant_text,
)

if TYPE_CHECKING:  # verifier actors load this module and never need torch
    import torch

logger = logging.getLogger(__name__)

_MAX_START_ATTEMPTS = 3
VerifierStatus = Literal["ok", "timeout", "error", "crashed"]


@dataclass(frozen=True)
class VerifierResult:
    """Score of one response. ``status`` other than ``ok`` always comes with ``reward == 0``. ``components``: the
    separate rewards of an environment that returns several (``reward`` is then their sum), else None."""

    reward: float
    answer: str | None
    status: VerifierStatus = "ok"
    error: str | None = None
    components: tuple[float, ...] | None = field(default=None, kw_only=True)  # subclasses add positional fields


@dataclass
class _Running:
    worker: int
    job: int
    attempt: int
    deadline: float


class VerifierPool:
    """``num_workers`` actors of ``worker_cls``, each built as ``worker_cls(*worker_args)``.

    ``worker_cls`` is a plain class whose ``score(*job) -> VerifierResult`` scores one job; an exception it raises
    becomes a ``status="error"`` result. ``timeout_s``: wall-clock limit per job. ``startup_timeout_s``: limit for a
    (re)started verifier to finish ``__init__``; exceeding it is an infrastructure failure and raises.
    """

    def __init__(
        self,
        worker_cls: type,
        worker_args: tuple[Any, ...],
        num_workers: int,
        timeout_s: float,
        startup_timeout_s: float = 300.0,
    ):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        # Verifiers are light and mostly idle: they take no logical CPU, so they never compete with the CPU bundles
        # that the cluster reserves for training and generation workers.
        self._actor_cls = ray.remote(num_cpus=0, max_concurrency=1)(worker_cls)  # type: ignore[call-overload]  # Ray's stubs omit actor options
        self._worker_args = worker_args
        self._timeout_s = timeout_s
        self._startup_timeout_s = startup_timeout_s
        self._workers: list[ActorHandle] = []
        self._warming: dict[ray.ObjectRef, int] = {}
        self._idle: deque[int] = deque()
        self._start_failures: Counter[int] = Counter()
        self.num_replacements = 0
        for index in range(num_workers):
            self._workers.append(self._actor_cls.remote(*worker_args))
            self._warming[self._workers[index].__ray_ready__.remote()] = index
        while self._warming:
            self._collect_warm(timeout_s=startup_timeout_s)

    @property
    def workers(self) -> list[ActorHandle]:
        """The current verifier actors (replaced ones are gone from the list)."""
        return list(self._workers)

    def score(self, jobs: Sequence[tuple[Any, ...]]) -> list[VerifierResult]:
        """Scores every job; results in job order. Never raises for a job's failure (see `VerifierResult.status`)."""
        results: list[VerifierResult | None] = [None] * len(jobs)
        queue: deque[tuple[int, int]] = deque((job, 0) for job in range(len(jobs)))
        running: dict[ray.ObjectRef, _Running] = {}
        while queue or running:
            while queue and self._idle:
                worker = self._idle.popleft()
                job, attempt = queue.popleft()
                ref: ray.ObjectRef = self._workers[worker].score.remote(*jobs[job])
                running[ref] = _Running(worker, job, attempt, time.monotonic() + self._timeout_s)
            if not running:  # every verifier is restarting
                self._collect_warm(timeout_s=self._startup_timeout_s)
                continue
            wait_s = max(0.0, min(run.deadline for run in running.values()) - time.monotonic())
            waitable = [*running, *self._warming]
            ready, _ = ray.wait(waitable, num_returns=1, timeout=wait_s)
            if ready:  # take everything finished by now, not just the first
                ready, _ = ray.wait(waitable, num_returns=len(waitable), timeout=0)
            for ref in ready:
                if ref in self._warming:
                    self._finish_warming(ref)
                else:
                    self._finish_job(ref, running.pop(ref), queue, results)
            now = time.monotonic()
            for ref, run in list(running.items()):
                if run.deadline <= now:
                    del running[ref]
                    logger.warning(
                        "verifier %d exceeded %.1f s on job %d; replacing it", run.worker, self._timeout_s, run.job
                    )
                    self._replace(run.worker, kill=True)
                    results[run.job] = VerifierResult(0.0, None, "timeout", f"no result within {self._timeout_s} s")
        missing = [job for job, result in enumerate(results) if result is None]
        if missing:  # unreachable unless the scheduling above is wrong; never return misaligned rewards
            raise RuntimeError(f"verifier pool finished without results for jobs {missing}")
        return results  # type: ignore[return-value]

    def shutdown(self) -> None:
        for worker in self._workers:
            ray.kill(worker)
        self._workers, self._warming, self._idle = [], {}, deque()

    def _finish_job(
        self,
        ref: ray.ObjectRef,
        run: _Running,
        queue: deque[tuple[int, int]],
        results: list[VerifierResult | None],
    ) -> None:
        try:
            results[run.job] = ray.get(ref)
            self._idle.append(run.worker)
        except ray.exceptions.RayTaskError as error:  # the verifier raised; the actor itself is fine
            cause = getattr(error, "cause", None) or error
            message = f"{type(cause).__name__}: {cause}"
            logger.warning("verifier raised on job %d (scored 0): %s", run.job, message)
            results[run.job] = VerifierResult(0.0, None, "error", message)
            self._idle.append(run.worker)
        except ray.exceptions.RayError as error:  # the actor died (killed, OOM, segfault)
            logger.warning("verifier %d died on job %d (%s); replacing it", run.worker, run.job, type(error).__name__)
            self._replace(run.worker, kill=False)
            if run.attempt == 0:
                queue.appendleft((run.job, 1))
            else:
                results[run.job] = VerifierResult(0.0, None, "crashed", f"{type(error).__name__}: {error}")

    def _replace(self, worker: int, kill: bool) -> None:
        if kill:
            ray.kill(self._workers[worker])
        self._workers[worker] = self._actor_cls.remote(*self._worker_args)
        self._warming[self._workers[worker].__ray_ready__.remote()] = worker
        self.num_replacements += 1

    def _collect_warm(self, timeout_s: float) -> None:
        ready, _ = ray.wait(list(self._warming), num_returns=1, timeout=timeout_s)
        if not ready:
            raise RuntimeError(
                f"{len(self._warming)} verifier actor(s) did not start within {timeout_s:.0f} s; check the Ray worker "
                "logs (a missing dependency or an exhausted machine)"
            )
        self._finish_warming(ready[0])

    def _finish_warming(self, ref: ray.ObjectRef) -> None:
        worker = self._warming.pop(ref)
        try:
            ray.get(ref)
        except ray.exceptions.RayError as error:
            # A verifier killed while starting is simply started again; one whose __init__ keeps failing is broken.
            self._start_failures[worker] += 1
            if self._start_failures[worker] >= _MAX_START_ATTEMPTS:
                raise RuntimeError(
                    f"verifier actor {worker} failed to start {_MAX_START_ATTEMPTS} times in a row; last error: {error}"
                ) from error
            self._replace(worker, kill=False)
            return
        self._start_failures[worker] = 0
        self._idle.append(worker)


class VerifierPoolEnvironment(EnvironmentInterface):
    """Single-turn environment that scores the last assistant message of each sample on a `VerifierPool`.

    Subclasses turn (response, metadata) into a verifier job (`make_job`, which also validates the metadata).
    Every step terminates the episode; the observation says whether the answer was right.
    """

    def __init__(self, worker_cls: type, worker_args: tuple[Any, ...], num_workers: int, timeout_s: float):
        self._pool = VerifierPool(worker_cls, worker_args, num_workers, timeout_s)
        self._counts: Counter[str] = Counter()
        self._replacements_reported = 0

    @abc.abstractmethod
    def make_job(self, response: str, metadata: Mapping[str, Any], sample_index: int) -> tuple[Any, ...]:
        """Arguments of the verifier's ``score`` for one sample; raises naming ``sample_index`` on bad metadata."""

    def step(
        self,
        message_log_batch: list[list[dict[str, Any]]],
        metadata: list[dict[str, Any]],
        return_extracted_answer: bool = False,
    ) -> EnvironmentReturn:
        """Scores each conversation's last assistant turn. ``answers`` always holds the extracted answers, whatever
        ``return_extracted_answer`` (NeMo-RL's switch for them) says: the rollout logs them."""
        check_step_batch(message_log_batch, metadata)
        jobs = [
            self.make_job(self.response_text(log, index), metadata[index], index)
            for index, log in enumerate(message_log_batch)
        ]
        results = self._pool.score(jobs)
        self._counts["scored"] += len(results)
        self._counts["extracted"] += sum(result.answer is not None for result in results)
        self._counts.update(result.status for result in results)
        self.record(results)
        import torch  # here, not at the top: verifier actors load this module and never need torch

        return EnvironmentReturn(
            observations=[{"role": "environment", "content": self.feedback(result)} for result in results],
            metadata=list(metadata),
            next_stop_strings=[None] * len(results),
            rewards=self.reward_tensor(results),
            terminateds=torch.ones(len(results), dtype=torch.bool),
            answers=[result.answer for result in results],
        )

    def response_text(self, message_log: list[dict[str, Any]], sample_index: int) -> str:
        """The text of one conversation that is scored: its last assistant message."""
        return last_assistant_text(message_log, sample_index)

    def reward_tensor(self, results: Sequence[VerifierResult]) -> torch.Tensor:
        """The step's rewards: float32 ``[B]``; an environment with several rewards returns ``[B, K]``."""
        import torch

        return torch.tensor([result.reward for result in results], dtype=torch.float32)

    def record(self, results: Sequence[VerifierResult]) -> None:
        """Called with each step's results, for subclasses that count more than the pool's statuses."""

    def feedback(self, result: VerifierResult) -> str:
        """The observation after a scored answer (logged; the episode ends)."""
        return _feedback(result.reward)

    def global_post_process_and_metrics(self, batch: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict[str, float]]:
        """Metrics of a rolled-out batch plus verifier health since the previous call; the batch is unchanged.

        Reads ``rewards`` (float[B], required) and, when present, ``is_end`` (bool[B]: the response ended with
        EOS rather than the length limit), ``generation_lengths`` and ``prompt_lengths`` (int[B], tokens).
        Metrics: ``accuracy`` (fraction with reward 1), ``mean_reward``, ``num_samples``,
        ``fraction_of_samples_properly_ended``, ``generation_lengths``, ``correct_solution_generation_lengths``,
        ``prompt_lengths`` (means), and over the responses scored since the previous call:
        ``fraction_answer_extracted``, ``verifier_timeouts``, ``verifier_errors``, ``verifier_crashes`` (counts)
        and ``verifier_restarts`` (verifier actors replaced).
        """
        metrics = batch_reward_metrics(batch)
        scored = self._counts["scored"]
        if scored:
            metrics["fraction_answer_extracted"] = self._counts["extracted"] / scored
        for status, name in (
            ("timeout", "verifier_timeouts"),
            ("error", "verifier_errors"),
            ("crashed", "verifier_crashes"),
        ):
            metrics[name] = float(self._counts[status])
        metrics["verifier_restarts"] = float(self._pool.num_replacements - self._replacements_reported)
        self._replacements_reported = self._pool.num_replacements
        self._counts.clear()
        return batch, metrics

    def verifier_workers(self) -> list[ActorHandle]:
        """The current verifier actors (for health checks and fault-injection tests)."""
        return self._pool.workers

    def shutdown(self) -> None:
        self._pool.shutdown()


def batch_reward_metrics(batch: Mapping[str, Any]) -> dict[str, float]:
    """Reward and length metrics of a batch (see `VerifierPoolEnvironment.global_post_process_and_metrics`)."""
    if "rewards" not in batch:
        raise KeyError(f"the batch needs 'rewards' (float[B]) for environment metrics; it has {sorted(batch)}")
    import torch

    rewards = torch.as_tensor(batch["rewards"], dtype=torch.float32).flatten()
    if rewards.numel() == 0:
        raise ValueError("batch['rewards'] is empty; there is nothing to compute metrics on")
    correct = rewards == 1.0
    metrics = {
        "accuracy": correct.float().mean().item(),
        "mean_reward": rewards.mean().item(),
        "num_samples": float(rewards.numel()),
    }
    if "is_end" in batch:
        metrics["fraction_of_samples_properly_ended"] = torch.as_tensor(batch["is_end"]).float().mean().item()
    if "generation_lengths" in batch:
        lengths = torch.as_tensor(batch["generation_lengths"]).float().flatten()
        metrics["generation_lengths"] = lengths.mean().item()
        if correct.any():
            metrics["correct_solution_generation_lengths"] = lengths[correct].mean().item()
    if "prompt_lengths" in batch:
        metrics["prompt_lengths"] = torch.as_tensor(batch["prompt_lengths"]).float().mean().item()
    return metrics


def _feedback(reward: float) -> str:
    if reward == 1.0:
        return "Environment: correct"
    if reward > 0.0:
        return f"Environment: partially correct (score {reward:.2f})"
    return "Environment: incorrect"
