"""What rollouts need from an environment: `EnvironmentInterface` and the `EnvironmentReturn` of one step.

Conventions shared with data and rollouts:
- a sample's conversation is a ``message_log``: a list of messages ``{"role": "system" | "user" | "assistant" |
  "environment", "content": str, "token_ids": LongTensor[T]}``; environments read only ``role`` and ``content``;
- each sample carries a metadata dict (the dataset's ``extra_env_info``), passed to ``step`` and handed back
  (possibly updated) for the next turn;
- observations are messages without ``token_ids`` (role ``user``, ``tool``, or ``environment``, which templates render
  as ``user``): the rollout chat-templates them as the next turn and tokenises them.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

if TYPE_CHECKING:  # verifier actors load environment modules: they must not pay for importing torch
    import torch

# What an environment keeps per sample between turns (NeMo-RL's type parameter); ours are dicts.
MetadataT = TypeVar("MetadataT")


class EnvironmentReturn(NamedTuple, Generic[MetadataT]):
    """Result of one `EnvironmentInterface.step` over a batch of B samples.

    observations: B messages ``{"role": "user" | "tool" | "environment", "content": str}``, the next turn of each
        conversation (ignored where the episode terminates).
    metadata: B metadata dicts for the next turn.
    next_stop_strings: B stop-string lists for the next generation turn (``None``: the generation config's own).
    rewards: float32[B], this turn's reward per sample; ``[B, K]`` for an environment with K separate rewards (the
        rollout sums them and keeps each as ``reward1`` .. ``rewardK``, which GDPO reads).
    terminateds: bool[B], True where the episode is over.
    answers: B extracted answers (``None`` where none was found), for logging and cons@k; the whole field may be
        ``None`` (the default) for an environment that extracts none.
    """

    observations: list[dict[str, str]]
    metadata: list[MetadataT]
    next_stop_strings: list[list[str] | None]
    rewards: torch.Tensor
    terminateds: torch.Tensor
    answers: list[str | None] | None = None


class EnvironmentInterface(abc.ABC, Generic[MetadataT]):
    """An environment; implementations are Ray actors (``@ray.remote``) and score text. They import no model code,
    except the reward-model environment, whose scorer is a model."""

    @abc.abstractmethod
    def step(
        self, message_log_batch: list[list[dict[str, Any]]], metadata: list[MetadataT]
    ) -> EnvironmentReturn[MetadataT]:
        """React to the last assistant turn of each of the B conversations."""

    @abc.abstractmethod
    def global_post_process_and_metrics(self, batch: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict[str, float]]:
        """Batch-level post-processing after a rollout and the environment's metrics for it.

        ``batch`` holds at least ``rewards`` (float[B], the rollout's total reward per sample); implementations
        document the optional keys they read. Returns the (possibly updated) batch and a flat metrics dict.
        """

    def shutdown(self) -> None:  # optional hook, deliberately not abstract
        """Releases helper actors or processes; the default has none."""


_REWARD_COMPONENT = re.compile(r"reward(\d+)")


def reward_component_keys(batch: Mapping[str, Any]) -> list[str]:
    """A rolled-out batch's separate rewards, ``reward1``, ``reward2``, ... in number order (none when every
    environment returned one reward per sample); NeMo-RL's keys, which GDPO reads."""
    numbered = [(int(m.group(1)), key) for key in batch if (m := _REWARD_COMPONENT.fullmatch(str(key)))]
    return [key for _, key in sorted(numbered)]


def last_assistant_text(message_log: Sequence[Mapping[str, Any]], sample_index: int) -> str:
    """Content of the last assistant message of one conversation; ValueError naming the sample if there is none."""
    for message in reversed(message_log):
        if message.get("role") == "assistant":
            content = message.get("content")
            if not isinstance(content, str):
                raise TypeError(
                    f"sample {sample_index}: the last assistant message's content must be a str, got "
                    f"{type(content).__name__}"
                )
            return content
    roles = [message.get("role") for message in message_log]
    raise ValueError(f"sample {sample_index}: message_log has no assistant message to score (roles: {roles})")


def check_step_batch(message_log_batch: Sequence[Any], metadata: Sequence[Any]) -> None:
    """The two per-sample lists of `EnvironmentInterface.step` must pair up, with a dict of metadata per sample."""
    if len(message_log_batch) != len(metadata):
        raise ValueError(
            f"step got {len(message_log_batch)} message logs but {len(metadata)} metadata dicts; pass one of each "
            "per sample"
        )
    for index, sample_metadata in enumerate(metadata):
        if not isinstance(sample_metadata, Mapping):
            raise TypeError(f"sample {index}: metadata must be a dict, got {type(sample_metadata).__name__}")
