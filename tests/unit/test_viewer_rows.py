"""The per-token fields of the sample rows the rollout viewer reads (`samples.sample_rows`, docs/rollout_viewer.md).

A hand-made two-sample batch with the real SmolLM2 tokenizer: a one-turn answer with multi-byte characters, and a
two-turn episode whose environment reply sits between two assistant turns. The training batch comes from the real
`build_train_batch`, so the loss mask is the one the trainer uses.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from nemo_rl_clone.data.llm_message_utils import message_from_token_ids, observation_message
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer
from nemo_rl_clone.rollout.batches import build_train_batch
from nemo_rl_clone.rollout.config import RewardedLoopConfig
from nemo_rl_clone.utils.samples import sample_rows, token_texts

ANSWER = "π ≈ 3.14, so the answer is 日本 ✓ café"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TINY_LLAMA)


def _prompt(tokenizer, question: str) -> dict:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return {
        "role": "user",
        "content": text,
        "token_ids": torch.tensor(tokenizer.encode(text, add_special_tokens=False)),
    }


def _answer(tokenizer, text: str, first_logprob: float) -> dict:
    ids = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    message = message_from_token_ids("assistant", ids, tokenizer)
    # Distinct engine logprobs per token, so a misaligned slice shows.
    message["generation_logprobs"] = first_logprob - 0.01 * torch.arange(len(ids), dtype=torch.float32)
    return message


def _batch(tokenizer) -> BatchedDataDict:
    single = [_prompt(tokenizer, "What is pi?"), _answer(tokenizer, ANSWER, -0.5)]
    reply = observation_message({"role": "environment", "content": "Board: 3 1 2"}, tokenizer, True)
    reply["generation_logprobs"] = torch.zeros(len(reply["token_ids"]))
    episode = [
        _prompt(tokenizer, "Solve the puzzle."),
        _answer(tokenizer, "<move>up</move>", -1.0),
        reply,
        _answer(tokenizer, "<move>left</move>", -2.0),
    ]
    for log in (single, episode):
        log[0]["generation_logprobs"] = torch.zeros(len(log[0]["token_ids"]))
    return BatchedDataDict(
        message_log=[single, episode],
        idx=[7, 8],
        loss_multiplier=torch.tensor([1.0, 1.0]),
        truncated=torch.tensor([False, True]),
    )


def _train_data(tokenizer, batch: BatchedDataDict, overlong_filtering: bool) -> BatchedDataDict:
    cfg = SimpleNamespace(
        policy=SimpleNamespace(make_sequence_length_divisible_by=8),
        loop=RewardedLoopConfig(overlong_filtering=overlong_filtering),
    )
    return build_train_batch(batch, torch.tensor([0.5, -0.5]), tokenizer, cfg)


def test_token_texts_join_to_the_decoded_text(tokenizer) -> None:
    ids = tokenizer.encode(ANSWER + "\n  indented   spaces", add_special_tokens=False)
    texts = token_texts(ids, tokenizer)
    assert len(texts) == len(ids)
    assert "".join(texts) == tokenizer.decode(ids)
    # A multi-byte character split over byte tokens: its first bytes get "" and the last one the character.
    assert "" in texts and "日" in "".join(texts)
    assert all("\ufffd" not in t for t in texts)


def test_rows_carry_tokens_logprobs_mask_and_turns_aligned_with_the_response(tokenizer) -> None:
    batch = _batch(tokenizer)
    train_data = _train_data(tokenizer, batch, overlong_filtering=False)
    train_data["prev_logprobs"] = train_data["generation_logprobs"] - 0.25
    rows = sample_rows(batch, torch.tensor([1.0, 0.0]), torch.tensor([0.5, -0.5]), tokenizer, train_data)

    single, episode = rows
    assert single["prompt"].startswith("<|im_start|>") and single["prompt"].endswith("<|im_start|>assistant\n")
    assert single["response"] == ANSWER + tokenizer.eos_token
    for row, log in zip(rows, batch["message_log"], strict=True):
        response_ids = [int(t) for m in log[1:] for t in m["token_ids"]]
        n = len(response_ids)
        assert "".join(row["tokens"]) == row["response"]
        assert len(row["tokens"]) == len(row["generation_logprobs"]) == len(row["loss_mask"]) == n
        assert len(row["trainer_logprobs"]) == n
        assert sum(count for _, count in row["segments"]) == n
        engine = torch.cat([m["generation_logprobs"] for m in log[1:]]).tolist()
        assert row["generation_logprobs"] == pytest.approx(engine, abs=5e-5)
        assert row["trainer_logprobs"] == pytest.approx([v - 0.25 for v in engine], abs=5e-5)
        assert all(v == round(v, 4) for v in row["generation_logprobs"])

    assert single["segments"] == [["assistant", len(batch["message_log"][0][1]["token_ids"])]]
    assert single["loss_mask"] == [1] * len(single["tokens"]) and single["truncated"] is False
    first, reply, second = (len(m["token_ids"]) for m in batch["message_log"][1][1:])
    assert episode["segments"] == [["assistant", first], ["environment", reply], ["assistant", second]]
    assert episode["loss_mask"] == [1] * first + [0] * reply + [1] * second  # the environment's reply is not trained
    assert "".join(episode["tokens"][first : first + reply]) == batch["message_log"][1][2]["content"]
    assert episode["truncated"] is True
    assert (single["idx"], single["reward"], single["advantage"]) == (7, 1.0, 0.5)
    json.dumps(rows)  # what log_samples_jsonl writes


def test_sample_mask_zeroes_the_loss_mask_and_missing_trainer_logprobs_are_omitted(tokenizer) -> None:
    batch = _batch(tokenizer)
    train_data = _train_data(tokenizer, batch, overlong_filtering=True)  # the truncated episode gets no gradient
    single, episode = sample_rows(batch, torch.tensor([1.0, 0.0]), None, tokenizer, train_data)
    assert set(episode["loss_mask"]) == {0} and set(single["loss_mask"]) == {1}
    assert "trainer_logprobs" not in single and "advantage" not in single
    # Without a tokenizer the rows stay as older runs wrote them (plus the truncation flag).
    plain = sample_rows(batch, torch.tensor([1.0, 0.0]))[1]
    assert set(plain) == {"prompt", "response", "reward", "idx", "truncated"}
