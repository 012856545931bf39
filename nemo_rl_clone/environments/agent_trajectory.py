"""Training samples from the calls an agent made to the run's model server, built from the server's records alone.

An agent episode is user code that calls the policy through an OpenAI-compatible endpoint, maybe many times. The
server records every call exactly as the engine saw it: the prompt's token ids, the generated token ids, their
processed logprobs (the distribution the trainer recomputes), and the version of the weights that generated them.
Samples are made from these records, never from the agent's text: re-tokenised text can differ from what was sampled.

- **Append-only episodes** — each call's prompt starts with the previous call's prompt and output, as a chat client
  that keeps its conversation produces — become **one sample**: the first prompt, then generated tokens (trained) and
  the tokens the agent added between calls (tool results, user turns, the chat template's headers; not trained).
- **Any other episode** (the agent rewrote its context: dropped a turn, summarised, started a side conversation)
  becomes **one sample per call**, each scored with the episode's reward: the choice NeMo-RL makes for NeMo Gym
  trajectories that are not append-only. `first_context_break` says which call broke the chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from nemo_rl_clone.contract.episode import GENERATION_LOGPROBS, ServedCall
from nemo_rl_clone.data.interfaces import LLMMessageLogType
from nemo_rl_clone.data.llm_message_utils import message_from_token_ids

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class AgentSample:
    """One training sample of an episode: a message log in the rollout format (``token_ids`` and
    ``generation_logprobs`` on every message, 0 where the engine did not sample) and the weight version of each of
    its generated tokens, in order."""

    message_log: LLMMessageLogType
    weight_versions: tuple[int, ...]


def first_context_break(calls: Sequence[ServedCall]) -> int | None:
    """Index of the first call whose prompt does not start with the previous call's prompt and output; None when
    the episode is append-only (an episode of one call is)."""
    for index in range(1, len(calls)):
        previous = calls[index - 1].context
        if calls[index].prompt_token_ids[: len(previous)] != previous:
            return index
    return None


def episode_samples(calls: Sequence[ServedCall], tokenizer: PreTrainedTokenizerBase) -> list[AgentSample]:
    """The training samples of one episode's calls, in call order (see the module's docstring): one when the
    episode is append-only, else one per call. An episode without calls has no sample."""
    if not calls:
        return []
    if first_context_break(calls) is not None:
        return [_one_sample([call], tokenizer) for call in calls]
    return [_one_sample(calls, tokenizer)]


def _one_sample(calls: Sequence[ServedCall], tokenizer: PreTrainedTokenizerBase) -> AgentSample:
    """``calls`` form an append-only chain: prompt, output, added tokens, output, ..."""
    log = [_message("user", calls[0].prompt_token_ids, None, tokenizer)]
    seen = len(calls[0].prompt_token_ids)  # tokens of the chain already in the log
    for call in calls:
        if len(call.prompt_token_ids) > seen:
            log.append(_message("environment", call.prompt_token_ids[seen:], None, tokenizer))
        if call.output_token_ids:
            log.append(_message("assistant", call.output_token_ids, call.output_logprobs, tokenizer))
        seen = len(call.context)
    return AgentSample(log, tuple(version for call in calls for version in call.weight_versions or ()))


def _message(
    role: str, token_ids: Sequence[int], logprobs: Sequence[float] | None, tokenizer: PreTrainedTokenizerBase
) -> dict:
    message = message_from_token_ids(role, token_ids, tokenizer)
    values = torch.zeros(len(token_ids)) if logprobs is None else torch.tensor(logprobs)
    message[GENERATION_LOGPROBS] = values.to(torch.float32)
    return message
