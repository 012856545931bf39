"""`MathVerifyWorker`: one verifier process of the math environments (math-verify, or DAPO's string match), and the
gold answer of a sample. Its own module so that the math, multi-reward and Jaccard environments share it without
importing each other."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_rl_clone.environments import dapo_math_verifier
from nemo_rl_clone.environments.answer_extraction import extract_answer
from nemo_rl_clone.environments.verifier_pool import VerifierResult


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
