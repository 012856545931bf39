"""`CodeJaccardEnvironment` (``env.code_jaccard``, NeMo-RL v0.7.0's): a soft reward for code, the word-set overlap
of the response with the reference solution, for tasks whose tests cannot run yet.

Per-sample metadata: ``{"ground_truth": str}``, the reference. The scored text is every assistant message of the
conversation joined (NeMo-RL's choice). The reward is `jaccard_score`; the observation says ``jaccard aligned``
above 0.5, else ``jaccard misaligned``; every episode ends after its one turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

import ray

from nemo_rl_clone.environments.config import CodeJaccardEnvConfig, check_env_config
from nemo_rl_clone.environments.math_verify_worker import ground_truth_of
from nemo_rl_clone.environments.verifier_pool import VerifierPoolEnvironment, VerifierResult
from nemo_rl_clone.utils.config_validation import as_config

__all__ = [
    "CodeJaccardEnvConfig",
    "CodeJaccardEnvironment",
    "CodeJaccardEnvironmentMetadata",
    "CodeJaccardVerifyWorker",
    "jaccard_score",
]

# Scoring is a few set operations; the pool's deadline only guards against a pathological input.
_SCORE_TIMEOUT_S = 10.0
ALIGNED_ABOVE = 0.5  # the observation's (and `preference_alignment_rate`'s) threshold
HIGH_ALIGNMENT_ABOVE = 0.8


class CodeJaccardEnvironmentMetadata(TypedDict):
    ground_truth: str


def jaccard_score(response: str, ground_truth: str) -> float:
    """NeMo-RL's score in [0, 1]: both texts stripped and lower-cased; 1.0 when they are equal; else the Jaccard
    index of their whitespace-separated word sets times the ratio of the shorter text's length to the longer's (a
    penalty for degenerate lengths); 0.0 for an empty reference."""
    response, ground_truth = response.strip().lower(), ground_truth.strip().lower()
    if response == ground_truth:
        return 1.0
    response_words, reference_words = set(response.split()), set(ground_truth.split())
    if not reference_words:
        return 0.0
    jaccard = len(response_words & reference_words) / len(response_words | reference_words)
    length_ratio = min(len(response), len(ground_truth)) / max(len(response), len(ground_truth), 1)
    return min(1.0, max(0.0, jaccard * length_ratio))


class CodeJaccardVerifyWorker:
    """One scorer (run as a Ray actor by the environment's `VerifierPool`)."""

    def score(self, response: str, ground_truth: str) -> VerifierResult:
        """The pool's call: one response, its score and (as NeMo-RL extracts it) the stripped response."""
        return VerifierResult(jaccard_score(response, ground_truth), response.strip())

    def verify(
        self, pred_responses: list[str], ground_truths: list[str], return_extracted_answer: bool = False
    ) -> list[float] | tuple[list[float], list[str | None]]:
        """NeMo-RL's batch form: the scores, and the stripped responses too with ``return_extracted_answer``."""
        results = [self.score(response, truth) for response, truth in zip(pred_responses, ground_truths, strict=True)]
        scores = [result.reward for result in results]
        return (scores, [result.answer for result in results]) if return_extracted_answer else scores


@ray.remote(max_restarts=-1, max_task_retries=-1)  # a crashed environment restarts; in-flight steps are retried
class CodeJaccardEnvironment(VerifierPoolEnvironment):
    """The environment actor over ``cfg.num_workers`` `CodeJaccardVerifyWorker` actors. ``cfg``: a
    `CodeJaccardEnvConfig` or NeMo-RL's dict of its keys (``CodeJaccardEnvironment.remote({"num_workers": 2})``)."""

    def __init__(self, cfg: CodeJaccardEnvConfig | Mapping[str, Any]):
        self.cfg = as_config(cfg, CodeJaccardEnvConfig, key="env.code_jaccard")
        check_env_config("code_jaccard", self.cfg)
        super().__init__(CodeJaccardVerifyWorker, (), self.cfg.num_workers, _SCORE_TIMEOUT_S)

    def response_text(self, message_log: list[dict[str, Any]], sample_index: int) -> str:
        return "".join(str(message["content"]) for message in message_log if message.get("role") == "assistant")

    def make_job(self, response: str, metadata: Mapping[str, Any], sample_index: int) -> tuple[Any, ...]:
        return (response, ground_truth_of(metadata, sample_index))

    def feedback(self, result: VerifierResult) -> str:
        alignment = "aligned" if result.reward > ALIGNED_ABOVE else "misaligned"
        return f"Environment: jaccard {alignment} (score: {result.reward:.2f})"

    def global_post_process_and_metrics(self, batch: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict[str, float]]:
        """The metrics of every verifier environment (`VerifierPoolEnvironment`) and NeMo-RL's three:
        ``preference_alignment_rate`` (fraction of rewards above 0.5), ``average_preference_score`` (their mean)
        and ``high_alignment_rate`` (fraction above 0.8)."""
        import torch

        batch, metrics = super().global_post_process_and_metrics(batch)
        rewards = torch.as_tensor(batch["rewards"], dtype=torch.float32).flatten()
        metrics["preference_alignment_rate"] = (rewards > ALIGNED_ABOVE).float().mean().item()
        metrics["average_preference_score"] = rewards.mean().item()
        metrics["high_alignment_rate"] = (rewards > HIGH_ALIGNMENT_ABOVE).float().mean().item()
        return batch, metrics
