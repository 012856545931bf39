"""Prompt specs, data processors, collate functions and the processed dataset (real SmolLM2 tokenizer)."""

from __future__ import annotations

import pytest
import torch

from nemo_rl_clone.data.collate_fn import eval_collate_fn, rl_collate_fn
from nemo_rl_clone.data.datasets.common import AllTaskProcessedDataset
from nemo_rl_clone.data.interfaces import TaskDataSpec
from nemo_rl_clone.data.llm_message_utils import (
    add_loss_mask_to_message_log,
    batched_message_log_to_flat_message,
    message_from_token_ids,
)
from nemo_rl_clone.data.processors import math_data_processor, reasoning_gym_data_processor
from nemo_rl_clone.models.huggingface import load_tokenizer

COT = "examples/prompts/cot.txt"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-random-llama")


def _templated_ids(tokenizer, messages):
    encoded = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(encoded["input_ids"] if not isinstance(encoded, list) else encoded)


# ---------------------------------------------------------------- TaskDataSpec
def test_cot_prompt_file_formats_the_problem(monkeypatch, tmp_path):
    # Relative default path works from any working directory of the checkout.
    monkeypatch.chdir(tmp_path)
    spec = TaskDataSpec("math", prompt_file=COT)
    assert spec.format_prompt("What is 1+1?") == (
        "Think step-by-step to solve the following problem. Output your answer inside of \\boxed{} tags.:\n"
        "What is 1+1?\n"
    )
    assert spec.system_prompt is None
    assert TaskDataSpec("math").format_prompt("x {y}") == "x {y}"


def test_prompt_spec_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("Put it in \\boxed{} please:\n{}")
    with pytest.raises(ValueError, match=r"bad\.txt.*exactly one '\{\}' placeholder.*doubled"):
        TaskDataSpec("math", prompt_file=str(bad))
    none = tmp_path / "none.txt"
    none.write_text("no placeholder here")
    with pytest.raises(ValueError, match=r"none\.txt.*exactly one"):
        TaskDataSpec("math", prompt_file=str(none))
    with pytest.raises(FileNotFoundError, match=r"system_prompt_file: prompt file 'missing\.txt' not found"):
        TaskDataSpec("math", system_prompt_file="missing.txt")
    with pytest.raises(ValueError, match="give prompt_file or prompt, not both"):
        TaskDataSpec("math", prompt_file=COT, prompt="{}")


# ---------------------------------------------------------------- processors
def test_math_processor_builds_the_templated_prompt(tokenizer, tmp_path):
    system = tmp_path / "system.txt"
    system.write_text("You are a careful mathematician.")
    spec = TaskDataSpec("math", prompt_file=COT, system_prompt_file=str(system))
    datum = math_data_processor({"problem": "What is 12 + 7?", "expected_answer": 19}, spec, tokenizer, 512, idx=3)

    expected_messages = [
        {"role": "system", "content": "You are a careful mathematician."},
        {"role": "user", "content": spec.format_prompt("What is 12 + 7?")},
    ]
    token_ids = torch.cat([m["token_ids"] for m in datum["message_log"]]).tolist()
    assert token_ids == _templated_ids(tokenizer, expected_messages)
    assert [m["role"] for m in datum["message_log"]] == ["system", "user"]
    assert datum["length"] == len(token_ids)
    assert datum["extra_env_info"] == {"ground_truth": "19"}
    assert (datum["loss_multiplier"], datum["idx"], datum["task_name"]) == (1.0, 3, "math")
    assert "stop_strings" not in datum


def test_long_prompt_is_truncated_and_masked(tokenizer):
    spec = TaskDataSpec("math", prompt="Solve: {}", system_prompt="Be brief.")
    datum = math_data_processor({"problem": "1 + " * 50 + "1", "expected_answer": "51"}, spec, tokenizer, 11, idx=0)
    sizes = [len(m["token_ids"]) for m in datum["message_log"]]
    assert sizes == [6, 5]  # 11 tokens shared out, the first message gets the remainder
    assert datum["length"] == 11 and datum["loss_multiplier"] == 0.0
    full = _templated_ids(tokenizer, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "x"}])
    assert datum["message_log"][0]["token_ids"].tolist() == full[:6]  # a prefix of the real prompt, not garbage
    for message in datum["message_log"]:
        assert message["content"] == tokenizer.decode(message["token_ids"].tolist())
    # Exactly at the limit: untouched.
    untruncated = math_data_processor({"problem": "2", "expected_answer": "2"}, spec, tokenizer, 512, idx=0)
    exact = math_data_processor({"problem": "2", "expected_answer": "2"}, spec, tokenizer, untruncated["length"], 0)
    assert exact["loss_multiplier"] == 1.0 and exact["length"] == untruncated["length"]


def test_processor_errors_name_the_row_and_field(tokenizer):
    spec = TaskDataSpec("math")
    with pytest.raises(ValueError, match=r"row 7: field 'expected_answer' is missing or empty"):
        math_data_processor({"problem": "p", "expected_answer": "  "}, spec, tokenizer, 64, idx=7)
    with pytest.raises(ValueError, match=r"row 2: field 'problem' is missing"):
        math_data_processor({"expected_answer": "1"}, spec, tokenizer, 64, idx=2)
    with pytest.raises(ValueError, match=r"row 4: reasoning_gym rows need extra_env_info"):
        reasoning_gym_data_processor({"problem": "p", "extra_env_info": {"task": "x"}}, spec, tokenizer, 64, idx=4)


def test_reasoning_gym_processor_keeps_the_entry(tokenizer):
    entry = {"question": "Calculate 2 + 3.", "answer": "5", "metadata": {"source_dataset": "basic_arithmetic"}}
    row = {
        "problem": entry["question"],
        "expected_answer": "5",
        "task_name": "reasoning_gym",
        "extra_env_info": {"task": "basic_arithmetic", "entry": entry},
    }
    datum = reasoning_gym_data_processor(row, TaskDataSpec("reasoning_gym"), tokenizer, 128, idx=0)
    assert datum["task_name"] == "reasoning_gym"
    assert datum["extra_env_info"] == {"task": "basic_arithmetic", "entry": entry}
    assert "Calculate 2 + 3." in datum["message_log"][-1]["content"]


# ---------------------------------------------------------------- dataset + collate + rollout-side helpers
def _rows():
    return [
        {"problem": "What is 2 + 2?", "expected_answer": "4", "task_name": "math"},
        {"problem": "What is 10 - 3? Show all of your work in detail.", "expected_answer": "7", "task_name": "math"},
        {
            "problem": "Calculate 3 * 3.",
            "expected_answer": "9",
            "task_name": "reasoning_gym",
            "extra_env_info": {"task": "products", "entry": {"question": "Calculate 3 * 3.", "answer": "9"}},
        },
    ]


def test_processed_dataset_routes_rows_by_task(tokenizer):
    specs = {"math": TaskDataSpec("math", prompt_file=COT), "reasoning_gym": TaskDataSpec("reasoning_gym")}
    dataset = AllTaskProcessedDataset(_rows(), tokenizer, specs, max_seq_length=256)
    assert len(dataset) == 3
    assert dataset[0]["extra_env_info"] == {"ground_truth": "4"} and dataset[0]["idx"] == 0
    assert "\\boxed{}" in dataset[0]["message_log"][-1]["content"]
    assert dataset[2]["extra_env_info"]["task"] == "products"
    assert "\\boxed{}" not in dataset[2]["message_log"][-1]["content"]

    with pytest.raises(
        KeyError,
        match=r"row 0: no data processor for task_name 'chess'; known: \['code', 'math', 'reasoning_gym', 'sliding",
    ):
        AllTaskProcessedDataset([{"problem": "p", "task_name": "chess"}], tokenizer, specs, max_seq_length=64)[0]
    with pytest.raises(KeyError, match=r"row 2: no TaskDataSpec for task_name 'reasoning_gym'"):
        AllTaskProcessedDataset(_rows(), tokenizer, {"math": specs["math"]}, max_seq_length=64)[2]


def test_collate_then_flatten_then_append_generation(tokenizer):
    dataset = AllTaskProcessedDataset(_rows(), tokenizer, TaskDataSpec("any"), max_seq_length=256)
    data = [dataset[i] for i in range(3)]
    data[1]["stop_strings"] = ["</answer>"]
    batch = rl_collate_fn(data)

    assert batch.size == 3
    assert batch["length"].tolist() == [d["length"] for d in data]
    assert batch["batch_max_length"].tolist() == [max(d["length"] for d in data)] * 3
    assert batch["loss_multiplier"].dtype == torch.float32 and batch["loss_multiplier"].tolist() == [1.0] * 3
    assert batch["task_name"] == ["math", "math", "reasoning_gym"]
    assert batch["stop_strings"] == [None, ["</answer>"], None]
    assert batch["idx"] == [0, 1, 2]

    flat, input_lengths = batched_message_log_to_flat_message(
        batch["message_log"], pad_value_dict={"token_ids": tokenizer.pad_token_id}
    )
    assert input_lengths.tolist() == batch["length"].tolist()
    for row, datum in enumerate(data):
        expected = torch.cat([m["token_ids"] for m in datum["message_log"]])
        assert torch.equal(flat["token_ids"][row, : input_lengths[row]], expected)
        assert (flat["token_ids"][row, input_lengths[row] :] == tokenizer.pad_token_id).all()

    # The rollout side: generated ids appended as they are, then a training mask on assistant tokens only.
    generations = [[28, 29, tokenizer.eos_token_id], [30, tokenizer.eos_token_id], [31, 32, 33, 34]]
    for log, generated in zip(batch["message_log"], generations, strict=True):
        log.append(message_from_token_ids("assistant", generated, tokenizer))
    add_loss_mask_to_message_log(batch["message_log"], roles_to_train_on=["assistant"])
    flat, lengths = batched_message_log_to_flat_message(batch["message_log"], {"token_ids": tokenizer.pad_token_id})
    for row, generated in enumerate(generations):
        prompt_len = data[row]["length"]
        assert lengths[row] == prompt_len + len(generated)
        assert flat["token_ids"][row, prompt_len : lengths[row]].tolist() == generated
        assert flat["token_loss_mask"][row].tolist() == [0] * prompt_len + [1] * len(generated) + [0] * (
            flat["token_ids"].shape[1] - lengths[row]
        )


def test_eval_collate_and_collate_errors(tokenizer):
    dataset = AllTaskProcessedDataset(_rows()[:2], tokenizer, TaskDataSpec("math"), max_seq_length=64)
    batch = eval_collate_fn([dataset[0], dataset[1]])
    assert sorted(batch) == ["extra_env_info", "idx", "message_log", "stop_strings", "task_name"]
    assert batch["extra_env_info"] == [{"ground_truth": "4"}, {"ground_truth": "7"}]

    with pytest.raises(ValueError, match="rl_collate_fn: got an empty batch"):
        rl_collate_fn([])
    broken = dict(dataset[0])
    del broken["loss_multiplier"]
    with pytest.raises(KeyError, match=r"rl_collate_fn: sample 1 lacks \['loss_multiplier'\]"):
        rl_collate_fn([dataset[0], broken])
