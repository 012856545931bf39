"""Multiple-choice scoring (``env.math.verifier_type``): the letter after an "Answer:" label, against the gold
letter; reward 1.0 or 0.0.

``multilingual_multichoice`` looks for the label in each language of multilingual MMLU (the first label that
matches wins, in `MULTILINGUAL_ANSWER_REGEXES`' order) and reads A-D, also in Arabic, Bengali or full-width form;
``english_multichoice`` reads any letter A-Z after ``Answer:`` (MMLU-Pro has ten choices). Both first strip the
markdown and LaTeX wrappers that hide the label (`normalize_response`); the gold letter is normalised the same way.
These are the string functions NeMo-RL's ``nemo_rl.evals.answer_parsing`` exports (re-exported there).
"""

from __future__ import annotations

import re

from nemo_rl_clone.environments.config import MULTICHOICE_VERIFIER_TYPES
from nemo_rl_clone.environments.verifier_pool import VerifierResult

# Fill with one of MULTILINGUAL_ANSWER_REGEXES: the letter A-D (or its Arabic, Bengali or full-width form) after it.
MULTILINGUAL_ANSWER_PATTERN_TEMPLATE = "(?i){}[ \t]*([A-D]|[أ-د]|[অ]|[ব]|[ড]|[ঢ]|[Ａ]|[Ｂ]|[Ｃ]|[Ｄ])"

# "Answer:" as the languages of multilingual MMLU write it (the second entry carries Korean's invisible filler).
MULTILINGUAL_ANSWER_REGEXES: list[str] = [
    r"Answer\s*:", r"Answer\s*:", r"উত্তর\s*:", r"उत्तर\s*:", r"উত্তরঃ", r"উত্তর\s*:", r"Antwort\s*:",
    r"답변\s*:", r"정답\s*:", r"답\s*:", r"答案\s*：", r"答案\s*:", r"答\s*：", r"答\s*:", r"答复\s*：", r"答曰\s*：",
    "الإجابة:", "الجواب:", "إجابة:", "الإجابة النهائية:", "الإجابة الصحيحة:", "الإجابة الصحيحة هي:", "الإجابة هي:",
    "الجواب النهائي:", r"Respuesta\s*:", r"Risposta\s*:", r"答え\s*:", r"答え\s*：", r"回答\s*:", r"回答\s*：",
    r"解答\s*:", r"Jawaban\s*:", r"Réponse\s*:", r"Resposta\s*:", r"Jibu\s*:", r"Idahun\s*:", r"Ìdáhùn\s*:",
    r"Idáhùn\s*:", r"Àmọ̀nà\s*:", r"Àdáhùn\s*:", r"Ànúgọ\s*:", r"Àṣàyàn\s*:",
]  # fmt: skip

# Arabic, Bengali and full-width letters for the choices A-D, each read as " A" ... " D".
_CHOICE_LETTERS = {"أ": "A", "ب": "B", "ج": "C", "د": "D", "অ": "A", "ব": "B", "ড": "C", "ঢ": "D"}
_CHOICE_LETTERS |= {"Ａ": "A", "Ｂ": "B", "Ｃ": "C", "Ｄ": "D"}

# Markup that hides the answer from the patterns, removed in this order ("$\\boxed{" before "$", "{" last but one).
_MARKUP = (
    "**", "$\\boxed{", "}$", "\\$", "$\\text{", "$", "\\mathrm{", "\\{", "\\text", "\\(", "\\mathbf{", "{", "\\boxed",
)  # fmt: skip


def normalize_extracted_answer(extracted_answer: str) -> str:
    """The extracted choice with non-Latin letters for A-D written as Latin capitals, stripped."""
    for letter, latin in _CHOICE_LETTERS.items():
        extracted_answer = extracted_answer.replace(letter, f" {latin}")
    return extracted_answer.strip()


def normalize_response(response: str) -> str:
    """``response`` without the markdown bold and LaTeX wrappers that would keep the answer patterns from matching
    (closing ``}`` stay, except a ``}$``)."""
    for markup in _MARKUP:
        response = response.replace(markup, "")
    return response


_ENGLISH_ANSWER_PATTERN = r"(?i)Answer\s*:[ \t]*([A-Z])"
MULTICHOICE_VERIFIERS = MULTICHOICE_VERIFIER_TYPES


def extract_choice(response: str, verifier_type: str) -> str | None:
    """The chosen letter in ``response`` (already normalised), or None."""
    if verifier_type == "english_multichoice":
        match = re.search(_ENGLISH_ANSWER_PATTERN, response)
        return normalize_extracted_answer(match.group(1)) if match else None
    for label in MULTILINGUAL_ANSWER_REGEXES:
        match = re.search(MULTILINGUAL_ANSWER_PATTERN_TEMPLATE.format(label), response)
        if match:
            return normalize_extracted_answer(match.group(1))
    return None


class MultichoiceVerifyWorker:
    """One verifier process of the math environment under a multiple-choice ``verifier_type`` (run as a Ray actor
    by `VerifierPool`, like `MathVerifyWorker`): no math-verify, no timeouts of its own (two regex passes)."""

    def __init__(self, verifier_type: str) -> None:
        if verifier_type not in MULTICHOICE_VERIFIERS:
            raise ValueError(f"verifier_type must be one of {MULTICHOICE_VERIFIERS}, got {verifier_type!r}")
        self._verifier_type = verifier_type

    def score(self, response: str, ground_truth: str) -> VerifierResult:
        answer = extract_choice(normalize_response(response), self._verifier_type)
        return VerifierResult(float(answer is not None and answer == normalize_response(ground_truth)), answer)
