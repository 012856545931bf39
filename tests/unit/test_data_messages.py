"""Message logs: per-message chat templating, generated tokens, loss masks and flattening (real SmolLM2 tokenizer)."""

from __future__ import annotations

import copy

import pytest
import torch

from nemo_rl_clone.data.llm_message_utils import (
    add_loss_mask_to_message_log,
    batched_message_log_to_flat_message,
    get_formatted_message_log,
    get_keys_from_message_log,
    message_from_token_ids,
    message_log_to_flat_messages,
    observation_message,
)
from nemo_rl_clone.models.huggingface import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-random-llama")


def _reference_ids(tokenizer, messages, add_generation_prompt):
    """Independent reference: the tokenizer's own templated tokenisation of the whole conversation."""
    encoded = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    return list(encoded["input_ids"] if not isinstance(encoded, list) else encoded)


CONVERSATIONS = {
    "user_only": [{"role": "user", "content": "What is 12 + 7?"}],
    "system_user": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Compute 3*4.\n\nGive only the number."},
    ],
    "multi_turn": [
        {"role": "system", "content": "Solve puzzles."},
        {"role": "user", "content": "Move the tile."},
        {"role": "assistant", "content": "I move it left.  Done!"},
        {"role": "user", "content": "Board: [1 2]\n[3 _]"},
    ],
}


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_message_tokens_concatenate_to_the_templated_conversation(tokenizer, name, add_generation_prompt):
    messages = CONVERSATIONS[name]
    log = get_formatted_message_log(
        messages, tokenizer, add_bos_token=False, add_eos_token=False, add_generation_prompt=add_generation_prompt
    )

    assert [m["role"] for m in log] == [m["role"] for m in messages]
    concatenated = torch.cat([m["token_ids"] for m in log]).tolist()
    assert concatenated == _reference_ids(tokenizer, messages, add_generation_prompt)
    full_text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert "".join(m["content"] for m in log) == full_text
    for message, original in zip(log, messages, strict=True):
        assert message["token_ids"].dtype == torch.long and message["token_ids"].ndim == 1
        assert original["content"] in message["content"]
        # Each message's tokens decode to its own slice of the templated text.
        assert tokenizer.decode(message["token_ids"].tolist()) == message["content"]
    if add_generation_prompt:
        assert log[-1]["content"].endswith("<|im_start|>assistant\n")


def test_environment_role_is_templated_as_a_user_turn(tokenizer):
    messages = [
        {"role": "user", "content": "Start."},
        {"role": "assistant", "content": "ok"},
        {"role": "environment", "content": "Reward pending. Next move?"},
    ]
    log = get_formatted_message_log(
        messages, tokenizer, add_bos_token=False, add_eos_token=False, add_generation_prompt=True
    )
    as_user = [dict(m, role="user") if m["role"] == "environment" else m for m in messages]
    assert log[-1]["role"] == "environment"
    assert log[-1]["content"].startswith("<|im_start|>user\nReward pending.")
    assert torch.cat([m["token_ids"] for m in log]).tolist() == _reference_ids(tokenizer, as_user, True)


def test_template_that_is_not_prefix_stable_is_rejected(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{% if loop.last %} [LAST]{% endif %}\n{% endfor %}"
    )
    messages = CONVERSATIONS["system_user"]
    with pytest.raises(ValueError, match=r"messages\[:1\].*not a prefix"):
        get_formatted_message_log(messages, tok, add_bos_token=False, add_eos_token=False, add_generation_prompt=False)
    # A single message has no prefix to disagree with.
    assert (
        len(
            get_formatted_message_log(
                messages[:1], tok, add_bos_token=False, add_eos_token=False, add_generation_prompt=False
            )
        )
        == 1
    )


def test_bad_inputs_are_named(tokenizer):
    with pytest.raises(ValueError, match="message_log is empty"):
        get_formatted_message_log([], tokenizer, add_bos_token=False, add_eos_token=False, add_generation_prompt=True)
    with pytest.raises(ValueError, match=r"messages\[1\]\['role'\] must be one of"):
        get_formatted_message_log(
            [{"role": "user", "content": "a"}, {"role": "critic", "content": "b"}],
            tokenizer,
            add_bos_token=False,
            add_eos_token=False,
            add_generation_prompt=True,
        )
    with pytest.raises(ValueError, match=r"messages\[0\]\['content'\] must be a str, got int"):
        get_formatted_message_log(
            [{"role": "user", "content": 3}],
            tokenizer,
            add_bos_token=False,
            add_eos_token=False,
            add_generation_prompt=True,
        )
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = None
    with pytest.raises(ValueError, match="has no chat template"):
        get_formatted_message_log(
            [{"role": "user", "content": "a"}],
            tok,
            add_bos_token=False,
            add_eos_token=False,
            add_generation_prompt=True,
        )


def test_generated_tokens_are_kept_exactly_and_never_retokenised(tokenizer):
    # Two single-character tokens whose text re-tokenises into one merged token: decode→encode is not the identity.
    a, b = tokenizer.convert_tokens_to_ids(["a"]), tokenizer.convert_tokens_to_ids(["b"])
    generated = [a[0], b[0], tokenizer.eos_token_id]
    assert tokenizer.encode("ab", add_special_tokens=False) != generated[:2]

    prompt = get_formatted_message_log(
        [{"role": "user", "content": "Say ab"}],
        tokenizer,
        add_bos_token=False,
        add_eos_token=False,
        add_generation_prompt=True,
    )
    message = message_from_token_ids("assistant", torch.tensor(generated), tokenizer)
    assert message["token_ids"].tolist() == generated
    assert message["content"] == "ab<|im_end|>"
    assert message_from_token_ids("assistant", generated, tokenizer, skip_special_tokens=True)["content"] == "ab"

    flat = message_log_to_flat_messages([*prompt, message])
    assert flat["token_ids"][-3:].tolist() == generated
    assert flat["role"] == ["user", "assistant"]
    with pytest.raises(ValueError, match="role must be one of"):
        message_from_token_ids("bot", generated, tokenizer)
    with pytest.raises(ValueError, match="must be 1-D"):
        message_from_token_ids("assistant", [generated], tokenizer)


def _log(*parts: tuple[str, list[int]]):
    return [
        {"role": role, "content": f"{role}{i}", "token_ids": torch.tensor(ids)} for i, (role, ids) in enumerate(parts)
    ]


def test_loss_mask_covers_assistant_tokens_only():
    batch = [
        _log(("system", [1, 2]), ("user", [3]), ("assistant", [4, 5, 6])),
        _log(("user", [7, 8]), ("assistant", [9]), ("environment", [10, 11]), ("assistant", [12, 13])),
    ]
    add_loss_mask_to_message_log(batch, roles_to_train_on=["assistant"])
    masks = [torch.cat([m["token_loss_mask"] for m in log]).tolist() for log in batch]
    assert masks == [[0, 0, 0, 1, 1, 1], [0, 0, 1, 0, 0, 1, 1]]

    add_loss_mask_to_message_log(batch, roles_to_train_on=["assistant"], only_unmask_final=True)
    masks = [torch.cat([m["token_loss_mask"] for m in log]).tolist() for log in batch]
    assert masks == [[0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1]]
    with pytest.raises(ValueError, match=r"unknown roles \['critic'\]"):
        add_loss_mask_to_message_log(batch, roles_to_train_on=["critic"])


def test_flatten_and_right_pad_a_batch():
    batch = [
        _log(("user", [11, 12, 13]), ("assistant", [14, 15])),
        _log(("user", [21]), ("assistant", [22, 23])),
        [],  # an empty log pads to all-pad
    ]
    add_loss_mask_to_message_log(batch)
    flat, input_lengths = batched_message_log_to_flat_message(
        batch, pad_value_dict={"token_ids": -1}, make_sequence_length_divisible_by=4
    )
    assert input_lengths.tolist() == [5, 3, 0]
    assert flat["token_ids"].tolist() == [
        [11, 12, 13, 14, 15, -1, -1, -1],
        [21, 22, 23, -1, -1, -1, -1, -1],
        [-1] * 8,
    ]
    assert flat["token_loss_mask"].tolist() == [[0, 0, 0, 1, 1, 0, 0, 0], [0, 1, 1, 0, 0, 0, 0, 0], [0] * 8]
    assert flat["role"] == [["user", "assistant"], ["user", "assistant"], []]
    assert flat.size == 3

    flat, _ = batched_message_log_to_flat_message(batch[:2])
    assert flat["token_ids"].shape == (2, 5) and flat["token_ids"][1, 3:].tolist() == [0, 0]


def test_flatten_rejects_misaligned_or_missing_tensors():
    batch = [_log(("user", [1, 2]), ("assistant", [3]))]
    batch[0][1]["generation_logprobs"] = torch.tensor([-0.5])
    with pytest.raises(ValueError, match=r"sample 0, message 0 \(role 'user'\): 'generation_logprobs' must be a 1-D"):
        batched_message_log_to_flat_message(batch)

    batch[0][0]["generation_logprobs"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"one entry per token \(2 tokens\), got shape \(3,\)"):
        batched_message_log_to_flat_message(batch)

    batch[0][0]["generation_logprobs"] = torch.zeros(2)
    other = _log(("user", [4]))
    with pytest.raises(ValueError, match=r"sample 1 lacks tensor key\(s\) \['generation_logprobs'\]"):
        batched_message_log_to_flat_message([batch[0], other])

    other[0]["token_ids"] = [4]
    with pytest.raises(ValueError, match=r"sample 0, message 0 \(role 'user'\): 'token_ids' must be a 1-D tensor"):
        batched_message_log_to_flat_message([other])
    with pytest.raises(ValueError, match="empty"):
        batched_message_log_to_flat_message([])


def test_get_keys_from_message_log():
    log = _log(("user", [1]), ("assistant", [2]))
    assert get_keys_from_message_log(log, ["role", "missing"]) == [{"role": "user"}, {"role": "assistant"}]


@pytest.mark.parametrize("role", ["user", "tool", "environment"])
@pytest.mark.parametrize("ended_with_eos", [True, False])
def test_observations_continue_the_conversation_as_the_template_renders_it(tokenizer, role, ended_with_eos):
    """Prompt + generated answer + observation, each tokenised on its own, read as the template's rendering of
    the whole conversation; after a stop string (no end-of-turn token generated) the observation closes the turn."""
    answer = "I slide <move>8</move>"
    prompt = get_formatted_message_log(
        [{"role": "user", "content": "Solve it."}],
        tokenizer,
        add_bos_token=False,
        add_eos_token=False,
        add_generation_prompt=True,
    )
    generated = tokenizer.encode(answer + (tokenizer.eos_token if ended_with_eos else ""), add_special_tokens=False)
    observation = observation_message({"role": role, "content": "Solved."}, tokenizer, ended_with_eos)
    assert observation["role"] == role
    ids = [*torch.cat([m["token_ids"] for m in prompt]).tolist(), *generated, *observation["token_ids"].tolist()]
    template_role = "user" if role == "environment" else role
    conversation = [
        {"role": "user", "content": "Solve it."},
        {"role": "assistant", "content": answer},
        {"role": template_role, "content": "Solved."},
    ]
    expected = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(ids) == expected
    starts = "\n" if ended_with_eos else tokenizer.eos_token + "\n"
    assert observation["content"].startswith(starts + f"<|im_start|>{template_role}\nSolved.")


def test_bad_observations_are_named(tokenizer):
    with pytest.raises(ValueError, match=r"an observation must be .* got role 'assistant'"):
        observation_message({"role": "assistant", "content": "x"}, tokenizer, True)
    with pytest.raises(ValueError, match="content of type NoneType"):
        observation_message({"role": "user"}, tokenizer, True)
