"""DAPO's math scoring (``env.math.math_verify_impl: dapo_math_verify``): an exact match of normalised strings.

The answer is the text after the last ``Answer:`` in the response's last 300 characters (the DAPO prompt asks for
a final ``Answer: ...`` line); it and the gold answer are normalised by the rules of the Minerva paper (Lewkowycz et
al. 2022, appendix D: the part after the last ``=``, units and ``\\text{}`` wrappers dropped, ``\\frac12`` written
``\\frac{1}{2}``, thousands separators removed) and compared as strings. Reward 1.0 on a match, else 0.0. Unlike
math-verify it never parses the expressions: ``0.5`` and ``\\frac{1}{2}`` differ.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from nemo_rl_clone.environments.answer_extraction import extract_boxed

TAIL_CHARS = 300  # only the end of the response is searched for the answer line
STRICT_TAIL_CHARS = 100  # strict_box_verify: only the end of the response is searched for the box
_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

# Applied in this order (Minerva's normalisation).
_REPLACEMENTS = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)  # fmt: skip
_DROPPED = (
    "square", "ways", "integers", "dollars", "mph", "inches", "ft", "hours", "km", "units", "\\ldots", "sue",
    "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges",
    "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3",
    "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots",
)  # fmt: skip
_UNWRAPPED = ("text", "textbf", "overline")  # \text{x} -> x


def normalize_final_answer(final_answer: str) -> str:
    """``final_answer`` in the normal form both sides are compared in."""
    answer = final_answer.split("=")[-1]
    for old, new in _REPLACEMENTS:
        answer = answer.replace(old, new)
    for dropped in _DROPPED:
        answer = answer.replace(dropped, "")
    answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", r"$\3$", answer)  # keep only the first $...$ span
    for command in _UNWRAPPED:
        answer = re.sub(rf"(\\{command}\{{)(.*?)(\}})", r"\2", answer)
    answer = re.sub(r"(\\boxed\{)(.*)(\})", r"\2", answer)
    answer = re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}", answer)  # \frac12 -> \frac{1}{2}
    answer = re.sub(r"(sqrt)([^{])", r"sqrt{\2}", answer)  # \sqrt2 -> \sqrt{2}
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def extract_answer_line(response: str) -> str | None:
    """The text after the last ``Answer:`` in the response's last `TAIL_CHARS` characters, or None."""
    found = _ANSWER_LINE.findall(response[-TAIL_CHARS:])
    return found[-1] if found else None


def compute_score(
    solution_str: str,
    ground_truth: str,
    strict_box_verify: bool = False,
    pause_tokens_index: Sequence[int] | None = None,
) -> tuple[float, str | None]:
    """(reward 1.0 or 0.0, the extracted answer or None).

    ``strict_box_verify``: the answer is instead the last ``\\boxed{}`` in the response's last `STRICT_TAIL_CHARS`
    characters (with ``pause_tokens_index``, four positions: in the `STRICT_TAIL_CHARS` before the last of them),
    compared with the gold answer as written, without normalising either.
    """
    if strict_box_verify:
        return _strict_box_score(solution_str, ground_truth, pause_tokens_index)
    answer = extract_answer_line(solution_str)
    if answer is None:
        return 0.0, None
    return float(normalize_final_answer(answer) == normalize_final_answer(ground_truth)), answer


def _strict_box_score(
    solution_str: str, ground_truth: str, pause_tokens_index: Sequence[int] | None
) -> tuple[float, str | None]:
    if pause_tokens_index is None:
        tail = solution_str[-STRICT_TAIL_CHARS:]
    elif len(pause_tokens_index) != 4:
        raise ValueError(f"pause_tokens_index: expected 4 positions, got {len(pause_tokens_index)}")
    else:
        tail = solution_str[max(0, pause_tokens_index[-1] - STRICT_TAIL_CHARS) :]
    answer = extract_boxed(tail)
    return float(answer == ground_truth), answer
