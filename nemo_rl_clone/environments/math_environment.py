"""`MathEnvironment`: math-verify on the last assistant turn against the gold answer; reward 1.0 or 0.0.

``math_verify_impl: dapo_math_verify`` scores by DAPO's string match instead (`dapo_math_verifier`).

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

from nemo_rl_clone.environments import dapo_math_verifier
from nemo_rl_clone.environments.answer_extraction import extract_answer
from nemo_rl_clone.environments.config import MathEnvConfig, check_env_config
from nemo_rl_clone.environments.verifier_pool import VerifierPoolEnvironment, VerifierResult
from nemo_rl_clone.utils.unsupported_modules import refusing_getattr

MATH_VERIFY_IMPLS = ("hf_math_verify", "dapo_math_verify")
_STANDALONE_CALL_TIMEOUT_S = 10  # math-verify's per-call limit in a standalone `HFVerifyWorker`


class MathVerifyWorker:
    """One verifier process (run as a Ray actor by `VerifierPool`): scores a response against a gold answer.

    ``call_timeout_s``: math-verify's own per-call timeout (whole seconds; ``signal.alarm`` takes ints). It works
    because actor methods run in the process's main thread; the pool's outer deadline covers hangs it cannot stop.
    """

    def __init__(self, answer_extraction: str, call_timeout_s: int, math_verify_impl: str = "hf_math_verify"):
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
        from math_verify.errors import TimeoutException

        self._parse, self._verify, self._timeout_exception = parse, verify, TimeoutException
        self._extraction_config = [LatexExtractionConfig(), ExprExtractionConfig()]
        self._answer_extraction = answer_extraction
        self._call_timeout_s = call_timeout_s
        self._dapo = math_verify_impl == "dapo_math_verify"
        # The first parse compiles math-verify's regexes and warms sympy (~0.5 s): pay it before the first deadline.
        self.score("\\boxed{1}", "1")

    def score(self, response: str, ground_truth: str) -> VerifierResult:
        """Reward 1.0 if the response's answer equals the gold answer (math-verify), else 0.0.

        Raises ValueError if the gold answer does not parse (the pool scores that sample 0 and logs it).
        """
        if self._dapo:
            scored = dapo_math_verifier.compute_score(response, ground_truth)
            return VerifierResult(scored["score"], dapo_math_verifier.extract_answer_line(response))
        answer: str | None = None
        try:
            gold = self._parse_latex(_boxed(ground_truth))
            if not gold:
                raise ValueError(f"math-verify could not parse the ground truth {ground_truth!r}")
            if self._answer_extraction == "math_verify":
                prediction = self._parse_latex(response)
            else:
                answer = extract_answer(response, self._answer_extraction)
                if answer is None:
                    return VerifierResult(0.0, None)
                prediction = self._parse_latex(_boxed(answer))
            if self._answer_extraction == "math_verify" and len(prediction) > 1:
                # parse returns [sympy object, matched string]; never str() the sympy object: printing a huge
                # number can hang in C code.
                answer = prediction[-1] if isinstance(prediction[-1], str) else None
            correct = self._verify(gold, prediction, timeout_seconds=self._call_timeout_s, raise_on_error=True)
        except self._timeout_exception:
            return VerifierResult(0.0, answer, "timeout", f"math-verify exceeded {self._call_timeout_s} s")
        return VerifierResult(1.0 if correct else 0.0, answer)

    def _parse_latex(self, text: str) -> list[Any]:
        return self._parse(
            text,
            extraction_config=self._extraction_config,
            parsing_timeout=self._call_timeout_s,
            raise_on_error=True,
        )


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
        super().__init__(
            MathVerifyWorker,
            (cfg.answer_extraction, call_timeout_s, cfg.math_verify_impl),
            cfg.num_workers,
            cfg.verifier_timeout_s,
        )

    def make_job(self, response: str, metadata: Mapping[str, Any], sample_index: int) -> tuple[Any, ...]:
        return (response, ground_truth_of(metadata, sample_index))


def ground_truth_of(metadata: Mapping[str, Any], sample_index: int) -> str:
    """A sample's gold answer (``metadata["ground_truth"]``, a str or a number) as a string; raises naming the sample."""
    if "ground_truth" not in metadata:
        raise ValueError(
            f"sample {sample_index}: math environment metadata needs 'ground_truth'; it has {sorted(metadata)}"
        )
    ground_truth = metadata["ground_truth"]
    if isinstance(ground_truth, bool) or not isinstance(ground_truth, (str, int, float)):
        raise TypeError(
            f"sample {sample_index}: 'ground_truth' must be a str (or a number), got {type(ground_truth).__name__}"
        )
    return str(ground_truth)


def _boxed(answer: str) -> str:
    stripped = answer.strip()
    if "\\boxed" in stripped:
        return stripped
    if len(stripped) >= 2 and stripped.startswith("$") and stripped.endswith("$"):
        stripped = stripped.strip("$")
    return f"\\boxed{{{stripped}}}"


_MULTICHOICE = "multiple-choice verifiers in the math environment (env.math.verifier_type)"
_refused = refusing_getattr(
    __name__,
    {"MultilingualMultichoiceVerifyWorker": _MULTICHOICE, "EnglishMultichoiceVerifyWorker": _MULTICHOICE},
)


def __getattr__(name: str) -> Any:
    # NeMo-RL's path of the multi-reward environment; its module imports this one, so it is read on first use.
    if name == "MathMultiRewardEnvironment":
        from nemo_rl_clone.environments.math_multi_reward_environment import MathMultiRewardEnvironment

        return MathMultiRewardEnvironment
    return _refused(name)
