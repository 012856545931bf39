"""NeMo-RL v0.7.0's per-response reward functions (``nemo_rl.environments.rewards``): each takes
``(ground_truth, response)`` and returns ``(reward, is_correct)``; ``is_correct`` is None where the function judges
form, not correctness (`format_reward`). `combine_reward_functions` weighs several into one.

The answer is the text between the first ``<tag>`` and the last ``</tag>`` (greedy, across lines), as NeMo-RL reads
it. The image-grounding rewards (``bbox_giou_reward``, ``geo3k_reward``) belong to NeMo-RL's vision-language
environment and stop with one line naming it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

from nemo_rl_clone.utils.unsupported_modules import refusing_getattr

RewardFunction = Callable[[str, str], tuple[float, bool | None]]


@functools.cache
def _math_metric() -> Callable[..., Any]:
    # Built once and lazily: importing math-verify compiles its regexes and loads sympy (~0.5 s).
    from math_verify.metric import math_metric
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig

    return math_metric(
        gold_extraction_target=(LatexExtractionConfig(),),
        pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()),
    )


def _boxed(text: str) -> str:
    return text if text.startswith("\\boxed{") else f"\\boxed{{{text}}}"


def _tagged(response: str, tag: str) -> str | None:
    match = re.search(rf"<{tag}>([\s\S]*)</{tag}>", response)
    return match.group(1) if match else None


def math_expression_reward(ground_truth: str, response: str, tag: str = "answer") -> tuple[float, bool]:
    """math-verify's score of the ``<tag>`` answer against the gold answer (both read as boxed LaTeX); correct when
    the score exceeds 0.1. No tagged answer, or an answer math-verify cannot handle, scores ``(0.0, False)``."""
    answer = _tagged(response, tag)
    if answer is None:
        return 0.0, False
    try:
        score, _ = _math_metric()([_boxed(ground_truth)], [_boxed(answer)])
    except Exception:  # math-verify's TimeoutException included: an unverifiable answer scores 0
        return 0.0, False
    return float(score), score > 0.1


def format_reward(
    ground_truth: str, response: str, think_tag: str = "think", answer_tag: str = "answer"
) -> tuple[float, bool | None]:
    """0.25 for a ``<think>…</think>`` block plus 0.75 for an ``<answer>…</answer>`` block; correctness is None."""
    reward = 0.0
    if _tagged(response, think_tag) is not None:
        reward += 0.25
    if _tagged(response, answer_tag) is not None:
        reward += 0.75
    return reward, None


def exact_answer_alphanumeric_reward(
    ground_truth: str, response: str, answer_tag: str = "answer"
) -> tuple[float, bool]:
    """1.0 when the ``<answer_tag>`` answer equals the gold answer after keeping only letters and digits and
    lower-casing both (``"Paris."`` matches ``"paris"``); else 0.0."""
    answer = _tagged(response, answer_tag)
    if answer is not None and _alphanumeric(answer) == _alphanumeric(ground_truth):
        return 1.0, True
    return 0.0, False


def _alphanumeric(text: str) -> str:
    return "".join(character for character in text if character.isalnum()).lower()


def combine_reward_functions(
    reward_functions: Sequence[tuple[RewardFunction, float]],
) -> Callable[[str, str], tuple[float, bool]]:
    """One reward function from ``[(function, weight), ...]``: the rewards' weighted mean (weights renormalised to
    sum to 1), correct when every function that judges correctness (is_correct not None) says correct."""
    total = float(sum(weight for _, weight in reward_functions))
    weights = [weight / total for _, weight in reward_functions]

    def combined(ground_truth: str, response: str) -> tuple[float, bool]:
        results = [function(ground_truth, response) for function, _ in reward_functions]
        reward = sum(weight * result[0] for weight, result in zip(weights, results, strict=True))
        return float(reward), all(result[1] for result in results if result[1] is not None)

    return combined


__getattr__ = refusing_getattr(
    __name__,
    dict.fromkeys(
        ("bbox_giou_reward", "geo3k_reward", "verl_geo3k_reward"),
        "vision and audio inputs (vision-language / audio-language models)",
    ),
)
