"""DAPO's scoring (``env.math.math_verify_impl: dapo_math_verify``): answers worked out by hand from its rules."""

from __future__ import annotations

import pytest

from nemo_rl_clone.environments.dapo_math_verifier import compute_score, normalize_final_answer
from nemo_rl_clone.environments.math_environment import MathVerifyWorker


@pytest.mark.parametrize(
    ("answer", "normal"),
    [
        ("x = 5", "5"),  # the part after the last '='
        ("1,000 dollars", "1000"),  # a unit dropped, then the thousands separator of a plain number
        ("\\frac12", "\\frac{1}{2}"),
        ("\\sqrt2", "\\sqrt{2}"),
        ("$\\boxed{7}$", "7"),
        ("\\text{(B)}", "(B)"),
        ("90^\\circ", "90"),
        ("1,2", "12"),  # only digits and commas: read as one number, as Minerva's rules do
    ],
)
def test_normal_forms(answer: str, normal: str) -> None:
    assert normalize_final_answer(answer) == normal


def test_scores() -> None:
    def score(response: str, gold: str) -> tuple[float, bool, str | None]:
        scored = compute_score(response, gold)
        return scored["score"], scored["acc"], scored["pred"]  # NeMo-RL's dict

    assert score("Reasoning...\nAnswer: 42", "42") == (1.0, True, "42")
    assert score("Answer: \\frac12", "\\frac{1}{2}") == (1.0, True, "\\frac{1}{2}")  # the normalised prediction
    assert score("answer : 3\nAnswer: 4", "4") == (1.0, True, "4")  # case-insensitive; the last line counts
    assert score("Answer: 0.5", "\\frac{1}{2}") == (-1.0, False, "0.5")  # strings, not values
    assert score("The result is \\boxed{42}", "42") == (-1.0, False, "[INVALID]")  # no answer line
    assert score("Answer: 42" + " and more" * 40, "42") == (-1.0, False, "[INVALID]")  # outside the last 300 characters


def test_the_math_environment_scores_with_it() -> None:
    dapo = MathVerifyWorker("math_verify", call_timeout_s=5, math_verify_impl="dapo_math_verify")
    symbolic = MathVerifyWorker("math_verify", call_timeout_s=5)
    response = "So the answer is \\boxed{0.5}.\nAnswer: 0.5"
    assert dapo.score(response, "\\frac{1}{2}").reward == -1.0  # DAPO's wrong-answer reward
    assert symbolic.score(response, "\\frac{1}{2}").reward == 1.0  # math-verify compares values
    assert dapo.score("Answer: 1/2", "1/2").reward == 1.0
