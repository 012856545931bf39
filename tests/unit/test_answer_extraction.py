"""Answer extractors: each format, the `auto` order, and the config's Literal kept in step with the methods."""

from __future__ import annotations

import typing
from decimal import Decimal

import pytest

from nemo_rl_clone.environments.answer_extraction import (
    ANSWER_EXTRACTION_METHODS,
    extract_answer,
    extract_answer_tag,
    extract_boxed,
    extract_last_number,
)
from nemo_rl_clone.environments.config import AnswerExtraction, MathAnswerExtraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 42.", "42"),
        ("4 - 1 = 3", "3"),  # a binary minus is not a sign
        ("3-5", "5"),
        ("so x = -4.", "-4"),
        ("(-7)", "-7"),
        ("\u22127 degrees", "-7"),  # Unicode minus
        ("+7", "7"),
        ("pi is about 3.14.", "3.14"),
        ("half is .5", "0.5"),
        ("It costs 1,234,567 dollars", "1234567"),
        ("total 1,000.50", "1000.50"),
        ("the list 1, 2, 3", "3"),  # comma plus space separates numbers
        ("1,2345", "2345"),  # not a thousands group
        ("x = 3/4", "3/4"),
        ("y = -3/4", "-3/4"),
        ("H2O and v1.2", None),  # digits inside words are not numbers
        ("no digits here", None),
        ("", None),
        ("first 12 then 7 apples", "7"),
        ("**9**", "9"),
    ],
)
def test_extract_last_number(text: str, expected: str | None) -> None:
    assert extract_last_number(text) == expected


def test_last_number_output_is_decimal_parsable() -> None:
    # reasoning-gym's numeric scorers compare with Decimal(answer); the normalised forms must parse.
    for text in ["1,234.5", ".25", "\u22123", "+8"]:
        Decimal(extract_last_number(text))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("So \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces
        ("first \\boxed{1}, then \\boxed{2}", "2"),  # the last box
        ("\\boxed{3} and then \\boxed{4", "3"),  # unclosed (truncated) last box: previous complete one
        ("\\fbox{a{b}c}", "a{b}c"),
        ("\\boxed { 7 }", "7"),
        ("\\boxed{}", None),
        ("no box", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>7</answer>", "7"),
        ("<answer>1</answer> wait, <Answer>\n 2 \n</ANSWER>", "2"),  # last tag, case-insensitive, stripped
        ("thinking <answer> 5", "5"),  # stopped at the `</answer>` stop string, which engines drop
        ("<answer>a, b</answer> trailing 9", "a, b"),
        ("<answer>  </answer>", None),
        ("answer: 5", None),
    ],
)
def test_extract_answer_tag(text: str, expected: str | None) -> None:
    assert extract_answer_tag(text) == expected


def test_auto_prefers_tag_then_box_then_last_number() -> None:
    assert extract_answer("\\boxed{1} <answer>2</answer> 3", "auto") == "2"
    assert extract_answer("\\boxed{1} then 3", "auto") == "1"
    assert extract_answer("I think 3", "auto") == "3"
    assert extract_answer("no idea", "auto") is None


def test_dispatch_matches_the_extractors() -> None:
    text = "<answer>5</answer> \\boxed{6} 7"
    assert extract_answer(text, "answer_tag") == "5"
    assert extract_answer(text, "boxed") == "6"
    assert extract_answer(text, "last_number") == "7"


def test_unknown_method_lists_valid_ones() -> None:
    with pytest.raises(
        ValueError,
        match="unknown answer extraction method 'last_num'; valid methods: boxed, answer_tag, last_number, auto",
    ):
        extract_answer("1", "last_num")


def test_config_literals_match_the_methods() -> None:
    assert typing.get_args(AnswerExtraction) == ANSWER_EXTRACTION_METHODS
    assert typing.get_args(MathAnswerExtraction) == ("math_verify", *ANSWER_EXTRACTION_METHODS)
