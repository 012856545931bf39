"""Multiple-choice scoring in the math environment (``env.math.verifier_type``): the letter after an "Answer:"
label against the gold letter, as NeMo-RL's multiple-choice verifiers score GPQA, MMLU and MMLU-Pro."""

from __future__ import annotations

from typing import Any

import pytest
import ray

from nemo_rl_clone.environments import create_env
from nemo_rl_clone.environments.config import MathEnvConfig
from nemo_rl_clone.environments.multichoice_verifier import MultichoiceVerifyWorker, extract_choice, normalize_response
from nemo_rl_clone.utils.config_validation import ConfigError, validate_config
from tests.unit.test_environments_math import step

MULTILINGUAL = MultichoiceVerifyWorker("multilingual_multichoice")
ENGLISH = MultichoiceVerifyWorker("english_multichoice")


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("Reasoning...\nAnswer: C", "C"),
        ("answer :\tb", "B"),  # case-insensitive label and letter: the letter is read as written, then compared
        ("**Answer: $\\boxed{D}$**", "D"),  # markup around the label and the letter is stripped first
        ("答案：Ｂ", "B"),  # Chinese label, full-width colon and letter
        ("الإجابة: ب", "B"),  # Arabic label and letter
        ("Antwort: A, not Answer: D", "D"),  # the English label is tried first, wherever it is in the text
        ("Answer: E", None),  # multilingual MMLU has four choices
        ("The answer is A.", None),  # no label, no answer
    ],
)
def test_multilingual_reads_the_letter_after_a_label(response: str, expected: str | None) -> None:
    found = extract_choice(normalize_response(response), "multilingual_multichoice")
    assert (found.upper() if found else found) == expected


def test_english_reads_any_letter_and_scores_against_the_normalised_gold() -> None:
    assert ENGLISH.score("Answer: J", "J").reward == 1.0  # MMLU-Pro's ten choices
    assert ENGLISH.score("Antwort: A", "A").reward == 0.0  # English label only
    assert ENGLISH.score("Answer: B", "**B**") == MULTILINGUAL.score("Answer: B", "B")
    assert MULTILINGUAL.score("Answer: A", "B").reward == 0.0
    assert MULTILINGUAL.score("Answer: A", "B").answer == "A"  # the answer found is kept for cons@k
    with pytest.raises(ValueError, match="verifier_type must be one of"):
        MultichoiceVerifyWorker("math")


def env_problems(**math: Any) -> list[str]:
    try:
        validate_config(math, MathEnvConfig)
    except ConfigError as err:
        return err.problems
    return []


def test_verifier_type_validation() -> None:
    assert env_problems(verifier_type="multilingual_multichoice") == []
    assert env_problems(verifier_type="math") == env_problems() == []
    assert env_problems(verifier_type="mgsm") == [
        "verifier_type: not supported yet: NeMo-RL's 'mgsm' verifier; built here: math, english_multichoice, "
        "multilingual_multichoice"
    ]
    assert env_problems(verifier_type="english_multichoice", answer_extraction="last_number") == [
        "answer_extraction: only applies with verifier_type math, not 'english_multichoice'"
    ]


def test_the_environment_scores_letters_with_a_multichoice_verifier(ray_local: None) -> None:
    env = create_env("math", MathEnvConfig(num_workers=1, verifier_type="multilingual_multichoice"))
    try:
        result = step(env, ["Answer: B", "Answer: C", "\\boxed{B}"], ["B", "B", "B"])
        assert result.rewards.tolist() == [1.0, 0.0, 0.0]  # a boxed letter without the label is no answer
        assert result.answers == ["B", "C", None]
    finally:
        ray.kill(env)


def test_nemo_rl_verifier_actors(ray_local: None) -> None:
    from nemo_rl_clone.environments.math_environment import (
        EnglishMultichoiceVerifyWorker,
        MultilingualMultichoiceVerifyWorker,
    )

    multilingual = MultilingualMultichoiceVerifyWorker.remote()
    english = EnglishMultichoiceVerifyWorker.remote()
    try:
        assert ray.get(multilingual.verify.remote(["Risposta: C", "no"], ["C", "A"])) == [1.0, 0.0]
        assert ray.get(english.verify.remote(["Answer: H"], ["H"], return_extracted_answer=True)) == ([1.0], ["H"])
    finally:
        ray.kill(multilingual)
        ray.kill(english)
