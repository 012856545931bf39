"""`MathMultiRewardEnvironment` (``env.math_multi_reward``, NeMo-RL v0.7.0's name): three rewards per response, for
GDPO (``grpo.adv_estimator.name: gdpo``), which normalises each on its own.

The answer is the text inside the last ``<answer>...</answer>`` (the whole response, stripped, when there is no tag:
NeMo-RL's rule). Components, each 0.0 or 1.0, in this order (the batch's ``reward1``, ``reward2``, ``reward3``):

1. ``correctness``: math-verify finds the answer equal to the gold answer (NeMo-RL compares the two strings
   exactly; math-verify also accepts equal values written differently, e.g. ``72.0`` for ``72``);
2. ``integer``: the answer is all digits (``str.isdigit``);
3. ``format``: the whole response is ``<think>...</think>\\n<answer>...</answer>`` with one answer tag pair.

The episode's reward (``total_reward``) is their sum, 0 to 3. A response whose scoring fails (timeout, crash, a gold
answer math-verify cannot parse) scores 0 on every component.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import ray

from nemo_rl_clone.environments.config import MathMultiRewardEnvConfig, check_env_config
from nemo_rl_clone.environments.math_verify_worker import MathVerifyWorker, ground_truth_of
from nemo_rl_clone.environments.verifier_pool import VerifierPoolEnvironment, VerifierResult, batch_reward_metrics

if TYPE_CHECKING:
    import torch

REWARD_COMPONENTS = ("correctness", "integer", "format")
_FORMAT = re.compile(r"^<think>.*?</think>\n<answer>.*?</answer>$", re.DOTALL)


def tagged_answer(response: str) -> str:
    """The text after the last ``<answer>`` up to the next ``</answer>``, stripped (the whole response without tags)."""
    return response.split("<answer>")[-1].split("</answer>")[0].strip()


def format_reward(response: str) -> float:
    """1.0 if the response is exactly ``<think>...</think>\\n<answer>...</answer>`` with one answer tag pair."""
    one_pair = response.count("<answer>") == 1 and response.count("</answer>") == 1
    return 1.0 if one_pair and _FORMAT.search(response) else 0.0


class MultiRewardMathWorker(MathVerifyWorker):
    """A `MathVerifyWorker` that scores the tagged answer and adds the integer and format components."""

    def __init__(self, call_timeout_s: int):
        super().__init__("math_verify", call_timeout_s)

    def score(self, response: str, ground_truth: str) -> VerifierResult:
        answer = tagged_answer(response)
        correctness = super().score(answer, ground_truth)
        if correctness.status != "ok":
            return VerifierResult(0.0, answer, correctness.status, correctness.error)
        components = (correctness.reward, 1.0 if answer.isdigit() else 0.0, format_reward(response))
        return VerifierResult(sum(components), answer, components=components)


@ray.remote(max_restarts=-1, max_task_retries=-1)  # a crashed environment restarts; in-flight steps are retried
class MathMultiRewardEnvironment(VerifierPoolEnvironment):
    """Math environment with three reward components (`REWARD_COMPONENTS`) over ``cfg.num_workers`` verifiers.

    ``step`` returns rewards ``[B, 3]``; the rollout sums them into ``total_reward`` and keeps each column as
    ``reward1`` .. ``reward3``. Metrics: ``accuracy`` (share with correctness 1) and the mean of each component as
    ``reward/<name>``, besides the pool's (`VerifierPoolEnvironment.global_post_process_and_metrics`).
    """

    def __init__(self, cfg: MathMultiRewardEnvConfig):
        check_env_config("math_multi_reward", cfg)
        call_timeout_s = max(1, int(cfg.verifier_timeout_s / 3))  # as `MathEnvironment`: three calls per response
        super().__init__(MultiRewardMathWorker, (call_timeout_s,), cfg.num_workers, cfg.verifier_timeout_s)

    def make_job(self, response: str, metadata: Mapping[str, Any], sample_index: int) -> tuple[Any, ...]:
        return (response, ground_truth_of(metadata, sample_index))

    def reward_tensor(self, results: Sequence[VerifierResult]) -> torch.Tensor:
        import torch

        failed = (0.0,) * len(REWARD_COMPONENTS)
        return torch.tensor([result.components or failed for result in results], dtype=torch.float32)

    def global_post_process_and_metrics(self, batch: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict[str, float]]:
        """The pool's metrics with ``accuracy`` (and the correct answers' lengths) judged by correctness alone, plus
        ``reward/<name>``: each component's mean. Reads ``reward1`` .. ``reward3`` besides ``rewards``."""
        _, metrics = super().global_post_process_and_metrics(batch)
        metrics.update(batch_reward_metrics({**batch, "rewards": batch["reward1"]}))
        metrics["mean_reward"] = float(batch["rewards"].float().mean())
        for k, name in enumerate(REWARD_COMPONENTS, start=1):
            metrics[f"reward/{name}"] = float(batch[f"reward{k}"].float().mean())
        return batch, metrics
