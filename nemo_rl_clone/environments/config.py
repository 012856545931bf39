"""Environment configs (``env``): one optional section per environment type."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

# Kept equal to answer_extraction.ANSWER_EXTRACTION_METHODS (a unit test checks); spelled out here so the config
# validator can name the valid values.
AnswerExtraction = Literal["boxed", "answer_tag", "last_number", "auto"]
# "math_verify": hand the whole response to math-verify, which finds \boxed{} or the last expression itself.
MathAnswerExtraction = Literal["math_verify", "boxed", "answer_tag", "last_number", "auto"]


def _check_pool(
    num_workers: int, verifier_timeout_s: float, answer_extraction: str, valid_extraction: object
) -> list[tuple[str, str]]:
    problems = []
    if answer_extraction not in get_args(valid_extraction):  # the validator checks Literals; hand-built configs not
        valid = ", ".join(get_args(valid_extraction))
        problems.append(("answer_extraction", f"unknown method {answer_extraction!r}; valid: {valid}"))
    if num_workers < 1:
        problems.append(("num_workers", f"must be >= 1, got {num_workers}"))
    if verifier_timeout_s <= 0:
        problems.append(("verifier_timeout_s", f"must be > 0, got {verifier_timeout_s}"))
    return problems


@dataclass
class MathEnvConfig:
    """``num_workers`` verifier actors; ``verifier_timeout_s``: wall-clock limit per response (then it scores 0)."""

    num_workers: int = 8
    math_verify_impl: Literal["hf_math_verify"] = "hf_math_verify"
    answer_extraction: MathAnswerExtraction = "math_verify"
    verifier_timeout_s: float = 10.0

    def check(self) -> list[tuple[str, str]]:
        return _check_pool(self.num_workers, self.verifier_timeout_s, self.answer_extraction, MathAnswerExtraction)


@dataclass
class ReasoningGymEnvConfig:
    """Scores reasoning-gym tasks with each task's own ``score_answer`` on the extracted answer.

    ``answer_extraction`` defaults to ``auto`` (answer tag, else \\boxed{}, else the last number): small models
    rarely emit tags, and the last number is what they reliably produce on arithmetic tasks.
    """

    num_workers: int = 2
    answer_extraction: AnswerExtraction = "auto"
    verifier_timeout_s: float = 10.0

    def check(self) -> list[tuple[str, str]]:
        return _check_pool(self.num_workers, self.verifier_timeout_s, self.answer_extraction, AnswerExtraction)


@dataclass
class EnvConfig:
    math: MathEnvConfig | None = field(default_factory=MathEnvConfig)
    reasoning_gym: ReasoningGymEnvConfig | None = None


def check_env_config(name: str, cfg: Any) -> None:
    """Raises ValueError listing every problem ``cfg.check()`` reports (if it has one), under ``env.<name>``."""
    check = getattr(cfg, "check", None)
    problems = check() if callable(check) else []
    if problems:
        raise ValueError(f"invalid env.{name} config: " + "; ".join(f"{key}: {message}" for key, message in problems))
