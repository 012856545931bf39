"""`MathEnvironment`: math-verify on the last assistant turn against the gold answer; reward 1.0 or 0.0.

``math_verify_impl: dapo_math_verify`` scores by DAPO's string match instead (`dapo_math_verifier`): reward 1.0 or
-1.0, as NeMo-RL passes DAPO's score on (``accuracy`` still counts the rewards of 1).

Per-sample metadata: ``{"ground_truth": str}`` (an int or float is accepted and turned into a string). The gold
answer is wrapped in ``\\boxed{}`` unless it already has one, so plain (``42``) and LaTeX (``\\frac{1}{2}``) answers
both parse. ``answer_extraction`` (`MathEnvConfig`): ``math_verify`` hands the whole response to math-verify, which
finds the last ``\\boxed{}`` or expression itself (NeMo-RL's behaviour); any other method extracts the answer first
(`answer_extraction.extract_answer`) and verifies only that, e.g. ``last_number`` for models that never box.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypedDict

import ray

from nemo_rl_clone.environments.config import MathEnvConfig, check_env_config
from nemo_rl_clone.environments.math_multi_reward_environment import MathMultiRewardEnvironment
from nemo_rl_clone.environments.math_verify_worker import MathVerifyWorker, ground_truth_of
from nemo_rl_clone.environments.multichoice_verifier import MultichoiceVerifyWorker
from nemo_rl_clone.environments.verifier_pool import VerifierPoolEnvironment, VerifierResult

__all__ = [
    "MATH_VERIFY_IMPLS",
    "EnglishMultichoiceVerifyWorker",
    "HFVerifyWorker",
    "MathEnvironment",
    "MathEnvironmentMetadata",
    "MathMultiRewardEnvironment",  # NeMo-RL's path of the multi-reward environment
    "MathVerifyWorker",
    "MultilingualMultichoiceVerifyWorker",
    "ground_truth_of",
    "verify_each",
]

MATH_VERIFY_IMPLS = ("hf_math_verify", "dapo_math_verify")
_STANDALONE_CALL_TIMEOUT_S = 10  # math-verify's per-call limit in a standalone `HFVerifyWorker`


class MathEnvironmentMetadata(TypedDict):
    """NeMo-RL's per-sample metadata of the math environment: the gold answer (and the answer extracted from the
    response, for cons@k)."""

    ground_truth: str
    extracted_answer: str | None


@ray.remote
class HFVerifyWorker:
    """NeMo-RL's verifier actor, on `MathVerifyWorker` (the scoring of the math environment, whole response handed
    to math-verify): ``HFVerifyWorker.remote().verify.remote(responses, gold_answers)``."""

    def __init__(self) -> None:
        self._verifiers: dict[str, MathVerifyWorker] = {}

    def verify(
        self,
        pred_responses: list[str],
        ground_truths: list[str],
        return_extracted_answer: bool = False,
        **kwargs: Any,
    ) -> list[float] | tuple[list[float], list[str | None]]:
        """Each response's reward (1.0 or 0.0; 0.0 where verification fails or times out) and, with
        ``return_extracted_answer``, the answers found. ``math_verify_impl`` (keyword): ``hf_math_verify`` (default)
        or ``dapo_math_verify``."""
        impl = kwargs.pop("math_verify_impl", "hf_math_verify")
        if kwargs or impl not in MATH_VERIFY_IMPLS:
            raise ValueError(
                f"HFVerifyWorker.verify: takes math_verify_impl (one of {MATH_VERIFY_IMPLS}) only; got "
                f"math_verify_impl={impl!r} and {sorted(kwargs)}"
            )
        if impl not in self._verifiers:
            self._verifiers[impl] = MathVerifyWorker("math_verify", _STANDALONE_CALL_TIMEOUT_S, impl)
        return verify_each(self._verifiers[impl].score, pred_responses, ground_truths, return_extracted_answer)


def verify_each(
    score: Callable[[str, str], VerifierResult],
    pred_responses: list[str],
    ground_truths: list[str],
    return_extracted_answer: bool,
) -> list[float] | tuple[list[float], list[str | None]]:
    """NeMo-RL's verifier-worker return over ``score``: the rewards, or (rewards, answers); a response whose
    scoring raises scores 0.0 with no answer."""
    rewards: list[float] = []
    answers: list[str | None] = []
    for response, ground_truth in zip(pred_responses, ground_truths, strict=True):
        try:
            result = score(response, ground_truth)
        except Exception:  # an unparsable gold answer: this sample scores 0, as in the environment's pool
            result = VerifierResult(0.0, None, "error")
        rewards.append(result.reward)
        answers.append(result.answer)
    return (rewards, answers) if return_extracted_answer else rewards


@ray.remote(max_restarts=-1, max_task_retries=-1)  # a crashed environment restarts; in-flight steps are retried
class MathEnvironment(VerifierPoolEnvironment):
    """Math environment actor over a pool of ``cfg.num_workers`` `MathVerifyWorker` actors.

    A response whose verification raises, times out (``cfg.verifier_timeout_s``) or kills its verifier scores 0;
    the step goes on with the other responses.
    """

    def __init__(self, cfg: MathEnvConfig):
        check_env_config("math", cfg)
        # Three math-verify calls per response (gold parse, answer parse, verify), each bounded by the inner
        # timeout, normally end before the pool's outer deadline kills the verifier.
        call_timeout_s = max(1, int(cfg.verifier_timeout_s / 3))
        if cfg.is_multichoice:
            worker: type = MultichoiceVerifyWorker
            args: tuple[Any, ...] = (cfg.verifier_type,)
        else:
            worker, args = MathVerifyWorker, (cfg.answer_extraction, call_timeout_s, cfg.math_verify_impl)
        super().__init__(worker, args, cfg.num_workers, cfg.verifier_timeout_s)

    def make_job(self, response: str, metadata: Mapping[str, Any], sample_index: int) -> tuple[Any, ...]:
        return (response, ground_truth_of(metadata, sample_index))


class _MultichoiceVerifyActor:
    """NeMo-RL's multiple-choice verifier actors: ``verify(pred_responses, ground_truths,
    return_extracted_answer=False)`` → rewards (1.0 / 0.0), and the letters found with ``return_extracted_answer``."""

    verifier_type = ""

    def __init__(self) -> None:
        self._worker = MultichoiceVerifyWorker(self.verifier_type)

    def verify(
        self,
        pred_responses: list[str],
        ground_truths: list[str],
        return_extracted_answer: bool = False,
        **kwargs: Any,
    ) -> list[float] | tuple[list[float], list[str | None]]:
        if kwargs:
            raise ValueError(f"{type(self).__name__}.verify: takes no other arguments, got {sorted(kwargs)}")
        return verify_each(self._worker.score, pred_responses, ground_truths, return_extracted_answer)


@ray.remote
class MultilingualMultichoiceVerifyWorker(_MultichoiceVerifyActor):
    verifier_type = "multilingual_multichoice"


@ray.remote
class EnglishMultichoiceVerifyWorker(_MultichoiceVerifyActor):
    verifier_type = "english_multichoice"
