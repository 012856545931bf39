"""Multiple-choice answer parsing at NeMo-RL v0.7.0's path (``nemo_rl.evals.answer_parsing``): the "Answer:" label in
the languages of multilingual MMLU, and normalisations of the chosen letter and of the response. They live with the
math environment's multiple-choice verifier that uses them (`nemo_rl_clone.environments.multichoice_verifier`)."""

from nemo_rl_clone.environments.multichoice_verifier import (
    MULTILINGUAL_ANSWER_PATTERN_TEMPLATE,
    MULTILINGUAL_ANSWER_REGEXES,
    normalize_extracted_answer,
    normalize_response,
)

__all__ = [
    "MULTILINGUAL_ANSWER_PATTERN_TEMPLATE",
    "MULTILINGUAL_ANSWER_REGEXES",
    "normalize_extracted_answer",
    "normalize_response",
]
