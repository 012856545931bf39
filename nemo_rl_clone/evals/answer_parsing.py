"""Multiple-choice answer parsing (NeMo-RL v0.7.0's ``nemo_rl.evals.answer_parsing``): the "Answer:" label in the
languages of multilingual MMLU, and normalisations of the chosen letter and of the response.

Pure string functions; the multiple-choice verifiers that use them in NeMo-RL are not built here
(``env.math.verifier_type`` is refused by name), but a user's own scorer can call these.
"""

from __future__ import annotations

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
