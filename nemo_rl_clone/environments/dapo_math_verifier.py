"""DAPO's math scoring (``env.math.math_verify_impl: dapo_math_verify``; NeMo-RL v0.7.0's
``nemo_rl.environments.dapo_math_verifier``): an exact match of normalised strings.

The answer is the text after the last ``Answer:`` in the response's last 300 characters (the DAPO prompt asks for
a final ``Answer: ...`` line); it and the gold answer are normalised by the rules of the Minerva paper (Lewkowycz et
al. 2022, appendix D: the part after the last ``=``, units and ``\\text{}`` wrappers dropped, ``\\frac12`` written
``\\frac{1}{2}``, thousands separators removed) and compared as strings. Reward 1.0 on a match, else -1.0 (DAPO's
±1, as NeMo-RL scores it). Unlike math-verify it never parses the expressions: ``0.5`` and ``\\frac{1}{2}`` differ.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

TAIL_CHARS = 300  # only the end of the response is searched for the answer line
STRICT_TAIL_CHARS = 100  # strict_box_verify: only the end of the response is searched for the box
MINERVA_ANSWER_PATTERN = r"(?i)Answer\s*:\s*([^\n]+)"
_BOX_OPEN = "\\boxed{"

# Minerva's normalisation, applied in this order: (old, new) replacements, then the expressions dropped.
SUBSTITUTIONS: list[tuple[str, str]] = [
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
]  # fmt: skip
REMOVED_EXPRESSIONS: list[str] = [
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
    "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges",
    "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3",
    "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots",
]  # fmt: skip
_UNWRAPPED = ("text", "textbf", "overline")  # \text{x} -> x


def last_boxed_only_string(string: str) -> str | None:
    """The last ``\\boxed{...}`` of ``string``, the command and its braces included (nested braces balanced), or
    None when there is none or it is never closed."""
    start = string.rfind(_BOX_OPEN)
    if start < 0:
        return None
    depth = 0
    for position in range(start, len(string)):
        if string[position] == "{":
            depth += 1
        elif string[position] == "}":
            depth -= 1
            if depth == 0:
                return string[start : position + 1]
    return None


def remove_boxed(s: str) -> str:
    """The content of ``\\boxed{content}``; a string not of that form raises ValueError."""
    if not (s.startswith(_BOX_OPEN) and s.endswith("}")):
        raise ValueError(f"remove_boxed: expected '\\boxed{{...}}', got {s!r}")
    return s[len(_BOX_OPEN) : -1]


def normalize_final_answer(final_answer: str) -> str:
    """``final_answer`` in the normal form both sides are compared in."""
    answer = final_answer.split("=")[-1]
    for old, new in SUBSTITUTIONS:
        answer = answer.replace(old, new)
    for dropped in REMOVED_EXPRESSIONS:
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


def is_correct_minerva(
    solution_str: str, gt: str, gt_need_extract: bool = False, answer_pattern: str = MINERVA_ANSWER_PATTERN
) -> tuple[bool, str]:
    """(whether the last ``answer_pattern`` match equals the gold answer once both are normalised, the normalised
    prediction). No match predicts ``"[INVALID]"``; ``gt_need_extract``: the gold answer is its last ``\\boxed{}``."""
    found = re.findall(answer_pattern, solution_str)
    prediction = normalize_final_answer(found[-1] if found else "[INVALID]")
    if gt_need_extract:
        boxed = last_boxed_only_string(gt)
        if boxed is None:
            raise ValueError(f"is_correct_minerva: gt_need_extract=True but the gold answer has no \\boxed{{}}: {gt!r}")
        gt = remove_boxed(boxed)
    return prediction == normalize_final_answer(gt), prediction


def is_correct_strict_box(
    pred: str, gt: str, pause_tokens_index: Sequence[int] | None = None
) -> tuple[int, str | None]:
    """(1 if the last ``\\boxed{}`` in the response's last `STRICT_TAIL_CHARS` characters equals ``gt`` as written,
    else -1; that box's content or None). With ``pause_tokens_index`` (four positions) the search starts
    `STRICT_TAIL_CHARS` before the last of them."""
    if pause_tokens_index is None:
        tail = pred[-STRICT_TAIL_CHARS:]
    elif len(pause_tokens_index) != 4:
        raise ValueError(f"pause_tokens_index: expected 4 positions, got {len(pause_tokens_index)}")
    else:
        tail = pred[max(0, pause_tokens_index[-1] - STRICT_TAIL_CHARS) :]
    boxed = last_boxed_only_string(tail)
    extracted = remove_boxed(boxed) if boxed is not None else None
    return (1 if extracted == gt else -1), extracted


def verify(
    solution_str: str,
    answer: str,
    strict_box_verify: bool = False,
    pause_tokens_index: Sequence[int] | None = None,
) -> tuple[bool, str | None]:
    """(correct, prediction): `is_correct_strict_box` when ``strict_box_verify``, else `is_correct_minerva`."""
    if strict_box_verify:
        score, prediction = is_correct_strict_box(solution_str, answer, pause_tokens_index)
        return score == 1, prediction
    return is_correct_minerva(solution_str, answer)


def extract_answer_line(response: str) -> str | None:
    """The text after the last ``Answer:`` in the response's last `TAIL_CHARS` characters, or None."""
    found = re.findall(MINERVA_ANSWER_PATTERN, response[-TAIL_CHARS:])
    return found[-1] if found else None


def compute_score(
    solution_str: str,
    ground_truth: str,
    strict_box_verify: bool = False,
    pause_tokens_index: Sequence[int] | None = None,
) -> dict[str, Any]:
    """NeMo-RL's score of the response's last `TAIL_CHARS` characters by `verify`: ``{"score": 1.0 or -1.0, "acc":
    correct, "pred": the prediction}`` (DAPO's ±1 reward; the prediction normalised, ``"[INVALID]"`` without an
    answer line; with ``strict_box_verify``, the box's content as written, or None)."""
    correct, prediction = verify(solution_str[-TAIL_CHARS:], ground_truth, strict_box_verify, pause_tokens_index)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": prediction}
