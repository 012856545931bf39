"""Supervised data: SFT / preference loaders on local files in the real formats (read through `datasets`), datums
(tokens = the chat template, loss mask = the trained messages), truncation and collation (real SmolLM2 tokenizer)."""

from __future__ import annotations

import json
from dataclasses import replace

import datasets
import pytest
import torch

from nemo_rl_clone.data.config import PreferenceDataConfig, SFTDataConfig
from nemo_rl_clone.data.datasets.common import LoadedDataset
from nemo_rl_clone.data.supervised import (
    PreferenceDataset,
    SFTDataset,
    build_datasets,
    build_preference_datum,
    build_sft_datum,
    load_preference_dataset,
    load_sft_dataset,
    preference_collate_fn,
    sft_collate_fn,
)
from nemo_rl_clone.models.huggingface import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-random-llama")


def _write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _template_ids(tokenizer, messages) -> list[int]:
    encoded = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=False)
    return list(encoded if isinstance(encoded, list) else encoded["input_ids"])


def _templated_turns(tokenizer, messages) -> list[str]:
    """Independent reference: message i's templated text = render(messages[:i+1]) minus render(messages[:i])."""

    def render(upto):
        return tokenizer.apply_chat_template(messages[:upto], tokenize=False) if upto else ""

    return [render(i + 1)[len(render(i)) :] for i in range(len(messages))]


def _flat(log, key) -> list[int]:
    return torch.cat([m[key] for m in log]).tolist()


MULTI_TURN = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "5."},
    {"role": "user", "content": "And times 4?"},
    {"role": "assistant", "content": "It is 20.\nDone!"},
]


# ---------------------------------------------------------------- SFT datums
def test_sft_datum_tokens_are_the_chat_template_and_mask_covers_exactly_the_assistant_turns(tokenizer):
    datum = build_sft_datum(MULTI_TURN, tokenizer, max_seq_length=512, idx=7)
    log = datum["message_log"]

    ids, mask = _flat(log, "token_ids"), _flat(log, "token_loss_mask")
    assert ids == _template_ids(tokenizer, MULTI_TURN)
    assert datum["length"] == len(ids) and datum["loss_multiplier"] == 1.0 and datum["idx"] == 7
    turns = _templated_turns(tokenizer, MULTI_TURN)
    masked_text = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m == 1])
    assert masked_text == turns[2] + turns[4]
    assert "5." in turns[2] and "It is 20.\nDone!" in turns[4]
    unmasked_text = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m == 0])
    assert unmasked_text == turns[0] + turns[1] + turns[3]


def test_tool_use_transcript_trains_on_the_calls_and_the_answer_not_the_tool_result(tmp_path, tokenizer):
    transcript = [
        {"role": "user", "content": "What is 12 * 34?"},
        {
            "role": "assistant",
            "content": '<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>',
        },
        {"role": "tool", "content": "408"},
        {"role": "assistant", "content": "<answer>408</answer>"},
    ]
    path = _write_jsonl(tmp_path / "tools.jsonl", [{"messages": transcript}])
    loaded = load_sft_dataset(SFTDataConfig(dataset_name="openai_format", data_path=path, val_data_path=path), 0)
    assert loaded.train[0]["messages"] == transcript
    datum = build_sft_datum(transcript, tokenizer, max_seq_length=512, idx=0)
    ids, mask = _flat(datum["message_log"], "token_ids"), _flat(datum["message_log"], "token_loss_mask")
    assert ids == _template_ids(tokenizer, transcript)  # the template renders the tool turn itself
    turns = _templated_turns(tokenizer, transcript)
    assert tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m == 1]) == turns[1] + turns[3]


def test_long_sft_datum_is_truncated_and_gets_loss_multiplier_zero(tokenizer):
    full = build_sft_datum(MULTI_TURN, tokenizer, max_seq_length=512, idx=0)
    cut = build_sft_datum(MULTI_TURN, tokenizer, max_seq_length=full["length"] - 1, idx=0)
    assert cut["length"] == full["length"] - 1 and cut["loss_multiplier"] == 0.0
    exact = build_sft_datum(MULTI_TURN, tokenizer, max_seq_length=full["length"], idx=0)
    assert exact["length"] == full["length"] and exact["loss_multiplier"] == 1.0
    tiny = build_sft_datum(MULTI_TURN, tokenizer, max_seq_length=12, idx=0)
    assert tiny["length"] == 12 and tiny["loss_multiplier"] == 0.0
    assert all(len(m["token_loss_mask"]) == len(m["token_ids"]) for m in tiny["message_log"])


def test_sft_collate_pads_right_and_carries_masks(tokenizer):
    short = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    dataset = SFTDataset([{"messages": MULTI_TURN}, {"messages": short}], tokenizer, max_seq_length=512)
    d0, d1 = dataset[0], dataset[1]
    truncated = build_sft_datum(short, tokenizer, max_seq_length=10, idx=2)
    batch = sft_collate_fn(
        [d0, d1, truncated], pad_token_id=tokenizer.pad_token_id, make_sequence_length_divisible_by=8
    )

    n0, n1 = d0["length"], d1["length"]
    padded = -(-n0 // 8) * 8
    assert batch["input_ids"].shape == (3, padded) and batch["input_ids"].dtype == torch.long
    assert batch["token_mask"].shape == (3, padded) and batch["token_mask"].dtype == torch.float32
    assert batch["input_lengths"].tolist() == [n0, n1, 10]
    assert batch["sample_mask"].tolist() == [1.0, 1.0, 0.0] and batch["sample_mask"].dtype == torch.float32
    assert batch["idx"] == [0, 1, 2]
    assert batch["input_ids"][1, :n1].tolist() == _flat(d1["message_log"], "token_ids")
    assert (batch["input_ids"][1, n1:] == tokenizer.pad_token_id).all()
    assert batch["token_mask"][1, :n1].tolist() == [float(x) for x in _flat(d1["message_log"], "token_loss_mask")]
    assert batch["token_mask"][1, n1:].sum() == 0 and batch["token_mask"][0, n0:].sum() == 0


# ---------------------------------------------------------------- SFT loaders
def _squad_rows(n, offset=0):
    return [
        {
            "id": f"q{offset + i}",
            "title": "Numbers",
            "context": f"The number {offset + i} follows {offset + i - 1}.",
            "question": f"What does {offset + i} follow?",
            "answers": {"text": [str(offset + i - 1), f"{offset + i - 1}."], "answer_start": [20, 20]},
        }
        for i in range(n)
    ]


def test_squad_rows_are_context_question_first_answer(tmp_path):
    train = _write_jsonl(tmp_path / "train.jsonl", _squad_rows(5))
    val = _write_jsonl(tmp_path / "val.jsonl", _squad_rows(2, offset=100))
    loaded = load_sft_dataset(SFTDataConfig(dataset_name="squad", data_path=train, val_data_path=val), seed=1)

    assert (len(loaded.train), len(loaded.validation)) == (5, 2)
    assert loaded.train[3]["messages"] == [
        {"role": "system", "content": "The number 3 follows 2."},
        {"role": "user", "content": "What does 3 follow?"},
        {"role": "assistant", "content": "2"},
    ]
    assert loaded.validation[0]["messages"][2]["content"] == "99"
    alone = load_sft_dataset(SFTDataConfig(dataset_name="squad", data_path=train), seed=1)
    assert alone.validation is None and len(alone.train) == 5


def test_squad_row_without_answer_names_row_and_field(tmp_path):
    rows = _squad_rows(3)
    rows[2]["answers"] = {"text": [], "answer_start": []}
    path = _write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError, match=r"squad \(.*bad\.jsonl\): row 2: field 'answers\.text' is missing or empty"):
        load_sft_dataset(SFTDataConfig(dataset_name="squad", data_path=path), seed=1)


def test_openmathinstruct2_sft_rows_and_seeded_holdout(tmp_path):
    rows = [
        {
            "problem": f"{i} + {i}?",
            "generated_solution": f"It is \\boxed{{{2 * i}}}.",
            "expected_answer": str(2 * i),
            "problem_source": "augmented_math",
        }
        for i in range(8)
    ]
    cfg = SFTDataConfig(
        dataset_name="OpenMathInstruct-2",
        data_path=_write_jsonl(tmp_path / "omi.jsonl", rows),
        split_validation_size=0.25,
    )
    first, again = load_sft_dataset(cfg, seed=3), load_sft_dataset(cfg, seed=3)
    assert (len(first.train), len(first.validation)) == (6, 2)
    assert list(first.validation["messages"]) == list(again.validation["messages"])
    problems = {r["messages"][0]["content"] for split in (first.train, first.validation) for r in split}
    assert problems == {f"{i} + {i}?" for i in range(8)}
    row = next(r for r in first.train if r["messages"][0]["content"] == "5 + 5?")
    assert row["messages"] == [
        {"role": "user", "content": "5 + 5?"},
        {"role": "assistant", "content": "It is \\boxed{10}."},
    ]


def test_openai_format_with_chat_key_prompt_files_and_errors(tmp_path):
    rows = [
        {"conversation": [{"role": "user", "content": f"Say {i}"}, {"role": "assistant", "content": str(i)}]}
        for i in range(4)
    ]
    rows.append({"conversation": [{"role": "system", "content": "Own system."}, *rows[0]["conversation"]]})
    train = _write_jsonl(tmp_path / "chat.jsonl", rows)
    (tmp_path / "prompt.txt").write_text("Task: {}")
    (tmp_path / "system.txt").write_text("Be brief.")
    cfg = SFTDataConfig(
        dataset_name="openai_format",
        data_path=train,
        val_data_path=train,
        chat_key="conversation",
        prompt_file=str(tmp_path / "prompt.txt"),
        system_prompt_file=str(tmp_path / "system.txt"),
    )
    loaded = load_sft_dataset(cfg, seed=0)
    assert loaded.train[1]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Task: Say 1"},
        {"role": "assistant", "content": "1"},
    ]
    assert loaded.train[4]["messages"][:2] == [
        {"role": "system", "content": "Own system."},
        {"role": "user", "content": "Task: Say 0"},
    ]

    with pytest.raises(ValueError, match=r"give data\.val_data_path"):
        load_sft_dataset(SFTDataConfig(dataset_name="openai_format", data_path=train, chat_key="conversation"), 0)
    only_user = {"conversation": [{"role": "user", "content": "x"}]}
    no_answer = _write_jsonl(tmp_path / "no_answer.jsonl", [rows[0], only_user])
    with pytest.raises(ValueError, match=r"no_answer\.jsonl\): row 1: field 'conversation' has no assistant message"):
        load_sft_dataset(
            SFTDataConfig(
                dataset_name="openai_format", data_path=no_answer, val_data_path=train, chat_key="conversation"
            ),
            0,
        )


def test_data_configs_check_names_and_keys():
    problems = SFTDataConfig(dataset_name="sqaud").check()
    assert problems == [
        (
            "dataset_name",
            "unknown dataset 'sqaud' (did you mean 'squad'?); "
            "valid names: squad, OpenMathInstruct-2, openai_format, champ",
        )
    ]
    ((key, message),) = PreferenceDataConfig(dataset_name="helpsteer3", data_path="x.jsonl").check()
    assert key == "dataset_name" and "did you mean 'HelpSteer3'?" in message
    assert [k for k, _ in SFTDataConfig(dataset_name="champ", data_path="a.jsonl").check()] == ["data_path"]
    assert [k for k, _ in SFTDataConfig(dataset_name="squad", split="train_1M").check()] == ["split"]
    assert [k for k, _ in PreferenceDataConfig(dataset_name="binary_preference").check()] == ["data_path"]
    assert SFTDataConfig().check() == [] and PreferenceDataConfig().check() == []
    with pytest.raises(ValueError, match="did you mean 'binary_preference'"):
        load_preference_dataset(PreferenceDataConfig(dataset_name="binary-preference"), seed=0)


# ---------------------------------------------------------------- preference datums and loaders
CONTEXT = [
    {"role": "user", "content": "Is 7 prime?"},
    {"role": "assistant", "content": "Let me check."},
    {"role": "user", "content": "Well?"},
]
CHOSEN = [{"role": "assistant", "content": "Yes, 7 is prime."}]
REJECTED = [{"role": "assistant", "content": "No, 7 = 2 * 3.5 so it is composite, as everyone knows."}]


def test_preference_datum_trains_only_on_the_answer(tokenizer):
    datum = build_preference_datum(CONTEXT, CHOSEN, REJECTED, tokenizer, max_seq_length=512, idx=4)
    for log, answer in ((datum["message_log_chosen"], CHOSEN), (datum["message_log_rejected"], REJECTED)):
        ids, mask = _flat(log, "token_ids"), _flat(log, "token_loss_mask")
        assert ids == _template_ids(tokenizer, CONTEXT + answer)
        turns = _templated_turns(tokenizer, CONTEXT + answer)
        assert (
            tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m]) == turns[-1]
        )  # not the context's assistant turn
    context_len = sum(len(m["token_ids"]) for m in datum["message_log_chosen"][:3])
    assert (
        _flat(datum["message_log_chosen"], "token_ids")[:context_len]
        == _flat(datum["message_log_rejected"], "token_ids")[:context_len]
    )
    assert datum["length_chosen"] < datum["length_rejected"] and datum["loss_multiplier"] == 1.0 and datum["idx"] == 4


def test_preference_collate_interleaves_pairs_and_a_truncated_answer_masks_both_rows(tokenizer):
    first = build_preference_datum(CONTEXT, CHOSEN, REJECTED, tokenizer, max_seq_length=512, idx=0)
    # Room for the chosen answer but not the longer rejected one.
    cut = build_preference_datum(CONTEXT, CHOSEN, REJECTED, tokenizer, first["length_chosen"], idx=1)
    assert cut["length_chosen"] == first["length_chosen"] and cut["length_rejected"] == first["length_chosen"]
    assert cut["loss_multiplier"] == 0.0

    batch = preference_collate_fn([first, cut], pad_token_id=tokenizer.pad_token_id)
    longest = first["length_rejected"]
    assert batch["input_ids"].shape == (4, longest) and batch["token_mask"].shape == (4, longest)
    assert batch["input_lengths"].tolist() == [
        first["length_chosen"],
        longest,
        first["length_chosen"],
        first["length_chosen"],
    ]
    assert batch["sample_mask"].tolist() == [1.0, 1.0, 0.0, 0.0] and batch["idx"] == [0, 0, 1, 1]
    n = first["length_chosen"]
    assert batch["input_ids"][0, :n].tolist() == _flat(first["message_log_chosen"], "token_ids")
    assert batch["input_ids"][1].tolist() == _flat(first["message_log_rejected"], "token_ids")
    assert (batch["input_ids"][0, n:] == tokenizer.pad_token_id).all() and batch["token_mask"][0, n:].sum() == 0


def _binary_rows(mixed: bool = True):
    """With ``mixed``, columns mix text and message lists (which `datasets` alone would mangle: "4" → 4)."""
    second = (
        {
            "prompt": [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "3*3?"}],
            "chosen": [{"role": "assistant", "content": "9"}],
            "rejected": "6",
        }
        if mixed
        else {"prompt": "3*3?", "chosen": "9", "rejected": "6"}
    )
    return [
        {"prompt": "What is 2+2?", "chosen": "4", "rejected": "5"},
        second,
        {"prompt": "Capital of France?", "chosen": "Paris", "rejected": "Lyon"},
        {"prompt": "1-1?", "chosen": "0", "rejected": "2"},
    ]


def test_binary_preference_rows_accept_text_or_messages(tmp_path, tokenizer):
    path = _write_jsonl(tmp_path / "pairs.jsonl", _binary_rows())
    cfg = PreferenceDataConfig(dataset_name="binary_preference", data_path=path, val_data_path=path)
    loaded = load_preference_dataset(cfg, seed=0)
    assert len(loaded.train) == 4 and len(loaded.validation) == 4
    assert loaded.train[0] == {
        "context": [{"role": "user", "content": "What is 2+2?"}],
        "chosen": [{"role": "assistant", "content": "4"}],
        "rejected": [{"role": "assistant", "content": "5"}],
    }
    assert loaded.train[1]["context"] == _binary_rows()[1]["prompt"]
    assert loaded.train[1]["rejected"] == [{"role": "assistant", "content": "6"}]
    datum = PreferenceDataset(loaded.train, tokenizer, max_seq_length=256)[1]
    assert _flat(datum["message_log_chosen"], "token_ids") == _template_ids(
        tokenizer, _binary_rows()[1]["prompt"] + [{"role": "assistant", "content": "9"}]
    )


@pytest.mark.parametrize("mixed", [True, False])
@pytest.mark.parametrize(("field", "value"), [("rejected", None), ("chosen", ""), ("rejected", [])])
def test_binary_preference_row_without_an_answer_names_file_row_and_field(tmp_path, field, value, mixed):
    rows = _binary_rows(mixed)
    if value is None:
        del rows[3][field]
    else:
        rows[3][field] = value
    path = _write_jsonl(tmp_path / "data.jsonl", rows)
    cfg = PreferenceDataConfig(dataset_name="binary_preference", data_path=path, split_validation_size=0.5)
    with pytest.raises(ValueError) as err:
        load_preference_dataset(cfg, seed=0)
    assert str(err.value) == f"binary_preference ({path}): row 3: field '{field}' is missing or empty"


def test_binary_preference_file_without_a_column_lists_the_columns(tmp_path):
    path = _write_jsonl(tmp_path / "data.jsonl", [{"prompt": "a", "chosen": "b"}])
    with pytest.raises(ValueError, match=r"missing column\(s\) \['rejected'\]; the file has \['prompt', 'chosen'\]"):
        load_preference_dataset(
            PreferenceDataConfig(dataset_name="binary_preference", data_path=path, val_data_path=path), seed=0
        )


def _helpsteer3_rows():
    def row(i, preference):
        return {
            "domain": "general",
            "language": "english",
            "context": [{"role": "user", "content": f"Question {i}"}],
            "response1": f"first answer {i}",
            "response2": f"second answer {i}",
            "overall_preference": preference,
            "individual_preference": [],
        }

    return [row(0, -2), row(1, 0), row(2, 3), row(3, -1), row(4, 0), row(5, 1)]


def test_helpsteer3_preference_direction_and_ties_skipped(tmp_path, capsys):
    path = _write_jsonl(tmp_path / "hs3.jsonl", _helpsteer3_rows())
    loaded = load_preference_dataset(
        PreferenceDataConfig(dataset_name="HelpSteer3", data_path=path, val_data_path=path), seed=0
    )
    assert len(loaded.train) == 4 and len(loaded.validation) == 4
    chosen = {r["context"][0]["content"]: r["chosen"][0]["content"] for r in loaded.train}
    rejected = {r["context"][0]["content"]: r["rejected"][0]["content"] for r in loaded.train}
    assert chosen == {
        "Question 0": "first answer 0",
        "Question 2": "second answer 2",
        "Question 3": "first answer 3",
        "Question 5": "second answer 5",
    }
    assert rejected == {
        "Question 0": "second answer 0",
        "Question 2": "first answer 2",
        "Question 3": "second answer 3",
        "Question 5": "first answer 5",
    }
    assert loaded.train[0]["chosen"][0]["role"] == "assistant"
    assert "skipped 2 of 6 rows (ties, overall_preference == 0)" in capsys.readouterr().out

    bad = _helpsteer3_rows()
    bad[4]["overall_preference"] = 5
    bad_path = _write_jsonl(tmp_path / "bad.jsonl", bad)
    with pytest.raises(ValueError, match=r"row 4: field 'overall_preference' must be an integer in \[-3, 3\], got 5"):
        load_preference_dataset(PreferenceDataConfig(dataset_name="HelpSteer3", data_path=bad_path), seed=0)


def test_drop_overlong_removes_exactly_the_rows_that_would_train_on_nothing(tokenizer, capsys):
    def answer(text):
        return [{"role": "assistant", "content": text}]

    short = {"context": [{"role": "user", "content": "2 + 3?"}], "chosen": answer("5"), "rejected": answer("6")}
    long = {**short, "chosen": answer("five " * 200)}
    rows = [short, long, short, long, long]
    loaded = LoadedDataset("binary_preference", train=rows, validation=datasets.Dataset.from_list([short, long]))
    # A pair is kept when both rows fit: the short pair is ~20 tokens here, the long one several hundred.
    cfg = PreferenceDataConfig(dataset_name="binary_preference", max_input_seq_length=64)

    kept_train, kept_val = build_datasets(PreferenceDataset, loaded, tokenizer, replace(cfg, drop_overlong=True))
    assert kept_train.rows == [short, short]
    assert len(kept_val) == 1 and kept_val[0]["loss_multiplier"] == 1.0
    out = capsys.readouterr().out
    assert "dropped 3 of 5 training rows longer than data.max_input_seq_length=64" in out
    assert "dropped 1 of 2 validation rows" in out

    train, val = build_datasets(PreferenceDataset, loaded, tokenizer, cfg)  # default: kept, masked (NeMo-RL)
    assert [train[i]["loss_multiplier"] for i in range(5)] == [1.0, 0.0, 1.0, 0.0, 0.0] and len(val) == 2

    only_long = LoadedDataset("binary_preference", train=[long], validation=None)
    with pytest.raises(
        ValueError,
        match=r"^data.drop_overlong: all 1 training rows are longer than "
        r"data.max_input_seq_length=64; raise it$",
    ):
        build_datasets(PreferenceDataset, only_long, tokenizer, replace(cfg, drop_overlong=True))
