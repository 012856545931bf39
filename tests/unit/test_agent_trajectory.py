"""An agent episode's served calls become training samples token for token (`environments/agent_trajectory.py`).

The records are built by hand at the token level (SmolLM2's tokenizer, as the tiny model uses): a chat prompt, a
generated answer with its logprobs, the tokens a client adds for a tool result and the next assistant header. The
expected samples are written out independently: the concatenation of the records' own ids, the loss mask 1 exactly
on generated positions, the engine's logprobs there and 0 elsewhere.
"""

from __future__ import annotations

import pytest
import torch

from nemo_rl_clone.contract.episode import ServedCall
from nemo_rl_clone.data.llm_message_utils import add_loss_mask_to_message_log, message_log_to_flat_messages
from nemo_rl_clone.environments.agent_trajectory import episode_samples, first_context_break
from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TINY_LLAMA)


def ids(tokenizer, text: str) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text, add_special_tokens=False))


def logprobs_for(tokens: tuple[int, ...], start: float) -> tuple[float, ...]:
    return tuple(start - 0.01 * i for i in range(len(tokens)))


@pytest.fixture(scope="module")
def calls(tokenizer) -> list[ServedCall]:
    """A calculator episode: ask, the model calls the tool, the client appends the tool's result, the model answers."""
    prompt = ids(tokenizer, "<|im_start|>user\nWhat is 17 * 3?<|im_end|>\n<|im_start|>assistant\n")
    call_tool = ids(tokenizer, '<tool_call>{"name": "calc", "arguments": {"expr": "17*3"}}</tool_call><|im_end|>')
    result = ids(tokenizer, "\n<|im_start|>user\n<tool_response>51</tool_response><|im_end|>\n<|im_start|>assistant\n")
    answer = ids(tokenizer, "The answer is 51.<|im_end|>")
    first = ServedCall(prompt, call_tool, logprobs_for(call_tool, -0.5), (3,) * len(call_tool))
    # a refit landed while the answer was sampled: its first two tokens are version 3, the rest 4
    second = ServedCall(
        prompt + call_tool + result, answer, logprobs_for(answer, -0.2), (3, 3) + (4,) * (len(answer) - 2)
    )
    return [first, second]


def flat(message_log) -> dict:
    add_loss_mask_to_message_log([message_log])
    return message_log_to_flat_messages(message_log)


def test_an_append_only_episode_is_one_sample_with_loss_on_generated_tokens_only(tokenizer, calls) -> None:
    second = calls[1]
    assert first_context_break(calls) is None
    (sample,) = episode_samples(calls, tokenizer)
    assert [m["role"] for m in sample.message_log] == ["user", "assistant", "environment", "assistant"]
    assert sample.weight_versions == (3,) * (len(calls[0].output_token_ids) + 2) + (4,) * (
        len(second.output_token_ids) - 2
    )
    tensors = flat(sample.message_log)
    expected_ids = second.prompt_token_ids + second.output_token_ids  # the whole conversation, once
    assert tensors["token_ids"].tolist() == list(expected_ids)
    generated = [False] * len(expected_ids)
    logprobs = [0.0] * len(expected_ids)
    for call in calls:
        start = len(call.prompt_token_ids)
        for k, value in enumerate(call.output_logprobs):
            generated[start + k], logprobs[start + k] = True, value
    assert tensors["token_loss_mask"].tolist() == [int(g) for g in generated]
    torch.testing.assert_close(tensors["generation_logprobs"], torch.tensor(logprobs), rtol=0, atol=0)
    # Content is the decoding of the ids as given (the tool result and the next header between the two answers).
    assert sample.message_log[2]["content"].startswith("\n<|im_start|>user\n<tool_response>51")


def test_an_episode_that_rewrites_its_context_gives_one_sample_per_call(tokenizer, calls) -> None:
    first, second = calls
    # The agent starts its second call from a fresh conversation holding only the tool's result.
    fresh = ids(tokenizer, "<|im_start|>user\nThe tool said 51. Answer.<|im_end|>\n<|im_start|>assistant\n")
    rewritten = ServedCall(fresh, second.output_token_ids, second.output_logprobs, second.weight_versions)
    third = ServedCall(rewritten.context + ids(tokenizer, "\nok"), (), ())
    episode = [first, rewritten, third]
    assert first_context_break(episode) == 1  # the third call extends the second, but the chain broke before it
    samples = episode_samples(episode, tokenizer)
    assert len(samples) == 3
    for call, sample in zip(episode, samples, strict=True):
        tensors = flat(sample.message_log)
        assert tensors["token_ids"].tolist() == list(call.context)
        assert tensors["token_loss_mask"].tolist() == [0] * len(call.prompt_token_ids) + [1] * len(
            call.output_token_ids
        )
    assert [m["role"] for m in samples[2].message_log] == ["user"]  # a call that generated nothing trains nothing
    assert samples[1].weight_versions == second.weight_versions
    assert samples[2].weight_versions == ()


def test_a_prompt_that_changes_one_earlier_token_breaks_the_chain(tokenizer, calls) -> None:
    first, second = calls
    changed = list(second.prompt_token_ids)
    changed[len(first.prompt_token_ids)] += 1  # the first generated token, re-tokenised differently by the client
    edited = ServedCall(tuple(changed), second.output_token_ids, second.output_logprobs)
    assert first_context_break([first, edited]) == 1
    assert len(episode_samples([first, edited], tokenizer)) == 2
    assert episode_samples([], tokenizer) == []


def test_malformed_records_are_refused() -> None:
    with pytest.raises(ValueError, match="2 output tokens but 1 output_logprobs"):
        ServedCall((1, 2), (3, 4), (-0.1,))
    with pytest.raises(ValueError, match="2 output tokens but 1 weight_versions"):
        ServedCall((1, 2), (3, 4), (-0.1, -0.2), (1,))
    assert ServedCall((1, 2), (3, 4), (-0.1, -0.2)).weight_versions == (0, 0)  # none given: all version 0
    with pytest.raises(ValueError, match="empty prompt"):
        ServedCall((), (3,), (-0.1,))
