"""NeMo-RL's evaluation sets read from their own sources (`eval_datasets.sources`): the full MATH test set and the
multiple-choice sets GPQA, MMLU (every language) and MMLU-Pro, each from a small local file in the source's format
(``data_path``); their prompts through `multichoice_qa_processor`; the config check that pairs them with a
multiple-choice ``env.math.verifier_type``. No network, no engine."""

from __future__ import annotations

import csv
import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from nemo_rl_clone.data.datasets import AllTaskProcessedDataset, DataError, load_eval_dataset
from nemo_rl_clone.data.datasets.eval_datasets import EVAL_DATASET_NAMES, MULTICHOICE_DATASETS
from nemo_rl_clone.data.datasets.eval_datasets.sources import (
    GPQA_PROMPT,
    MMLU_LANGUAGES,
    MMLU_PRO_PROMPT,
    mmlu_dataset_name,
    mmlu_language,
)
from nemo_rl_clone.data.nemo_rl_processors import multichoice_qa_processor
from nemo_rl_clone.data.processors import math_data_processor
from nemo_rl_clone.evals.config import EvalMasterConfig
from nemo_rl_clone.utils.config_validation import ConfigError, validate_config
from nemo_rl_clone.utils.errors import UserInputError

REPO = Path(__file__).resolve().parents[2]
GPQA_CHOICES = ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")


def write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> str:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return str(path)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def mmlu_file(path: Path) -> str:
    # simple-evals' layout: an unnamed index column first; "None" / "NA" are options, not missing values.
    header = ["", "Question", "A", "B", "C", "D", "Answer", "Subject"]
    rows = [
        [0, "2 + 2?", "4", "None", "5", "NA", "A", "math"],
        [1, "Capital of Italy?", "Paris", "Rome", 3, "", "B", "geo"],
    ]
    return write_csv(path, header, rows)


def gpqa_file(path: Path, rows: int = 12) -> str:
    return write_jsonl(
        path,
        [
            {"Question": f"Q{i}?", **{key: f"{key.split()[0].lower()}-{n}-{i}" for n, key in enumerate(GPQA_CHOICES)}}
            for i in range(rows)
        ],
    )


@pytest.fixture(scope="module")
def tokenizer():
    from nemo_rl_clone.models.huggingface import load_tokenizer

    return load_tokenizer("tiny-random-llama")


# ------------------------------------------------------------------------------------------------------- rows
def test_math_is_the_common_math_form(tmp_path):
    path = write_csv(tmp_path / "math_test.csv", ["Question", "Answer"], [["Compute $1+1$.", 2], ["Half?", "\\frac12"]])
    loaded = load_eval_dataset({"dataset_name": "math", "data_path": path, "prompt_file": None})
    assert list(loaded.rekeyed_ds) == [
        {"problem": "Compute $1+1$.", "expected_answer": "2", "task_name": "math"},
        {"problem": "Half?", "expected_answer": "\\frac12", "task_name": "math"},
    ]
    assert loaded.processor is math_data_processor and loaded.task_spec.task_name == "math"


def test_mmlu_rows_are_rekeyed_in_every_language(tmp_path):
    path = mmlu_file(tmp_path / "mmlu.csv")
    for name in ("mmlu", "mmlu_ZH-CN", "mmlu_YO-NG"):
        loaded = load_eval_dataset({"dataset_name": name, "data_path": path, "prompt_file": None})
        first, second = loaded.rekeyed_ds
        assert first == {
            "question": "2 + 2?",
            "options": {"A": "4", "B": "None", "C": "5", "D": "NA"},
            "answer": "A",
            "subject": "math",
            "task_name": "math",
        }
        assert second["options"] == {"A": "Paris", "B": "Rome", "C": "3", "D": None}  # an empty cell: no option
        assert loaded.processor is multichoice_qa_processor and loaded.task_spec.prompt is None  # no default prompt
    assert len(MMLU_LANGUAGES) == 15 and {"mmlu", "mmlu_ZH-CN", "mmlu_AR-XY", "mmlu_pro"} <= set(MULTICHOICE_DATASETS)
    assert (mmlu_language("mmlu"), mmlu_language("mmlu_DE-DE"), mmlu_language("mmlu_pro")) == ("EN-US", "DE-DE", None)
    assert mmlu_dataset_name("EN-US") == "mmlu" and set(MULTICHOICE_DATASETS) <= set(EVAL_DATASET_NAMES)
    with pytest.raises(DataError, match=r"^language: unknown MMLU language 'XX-YY'"):
        mmlu_dataset_name("XX-YY")


def test_mmlu_pro_keys_its_options_by_letter(tmp_path):
    path = write_jsonl(
        tmp_path / "mmlu_pro.jsonl",
        [
            {"question": "Pick c.", "options": ["a", "b", "c"], "answer": "C", "answer_index": 2, "category": "law"},
            {"question": "Pick 9.", "options": [str(i) for i in range(10)], "answer": "J", "category": "math"},
        ],
    )
    loaded = load_eval_dataset({"dataset_name": "mmlu_pro", "data_path": path, "prompt_file": None})
    first, second = loaded.rekeyed_ds
    assert first["options"] == {"A": "a", "B": "b", "C": "c", **dict.fromkeys("DEFGHIJ")}
    assert (first["answer"], first["subject"], first["task_name"]) == ("C", "law", "math")
    assert list(second["options"].values()) == [str(i) for i in range(10)] and second["answer"] == "J"
    assert loaded.task_spec.prompt == MMLU_PRO_PROMPT  # NeMo-RL's instruction without a prompt_file
    bad = write_jsonl(
        tmp_path / "bad.jsonl", [{"question": "Q", "options": ["a", "b"], "answer": "D", "category": "x"}]
    )
    with pytest.raises(DataError, match=r"row 0: answer 'D' is not one of the row's option letters \['A', 'B'\]"):
        load_eval_dataset({"dataset_name": "mmlu_pro", "data_path": bad})


def test_gpqa_shuffle_puts_the_correct_answer_at_the_recorded_letter_and_is_seeded(tmp_path):
    path = gpqa_file(tmp_path / "gpqa.jsonl")
    by_seed = {}
    for seed in (1, 2):
        loaded = load_eval_dataset({"dataset_name": "gpqa_diamond", "data_path": path}, seed=seed)
        assert loaded.processor is multichoice_qa_processor and loaded.task_spec.prompt == GPQA_PROMPT
        for i, row in enumerate(loaded.rekeyed_ds):
            assert row["question"] == f"Q{i}?" and row["task_name"] == "math" and "subject" not in row
            assert row["options"][row["answer"]] == f"correct-0-{i}"
            assert sorted(row["options"].values()) == sorted(
                f"{k.split()[0].lower()}-{n}-{i}" for n, k in enumerate(GPQA_CHOICES)
            )
        by_seed[seed] = [(row["answer"], row["options"]) for row in loaded.rekeyed_ds]
    again = load_eval_dataset({"dataset_name": "gpqa", "data_path": path}, seed=1)
    assert [(row["answer"], row["options"]) for row in again.rekeyed_ds] == by_seed[1]  # reproducible
    assert by_seed[1] != by_seed[2]  # another seed, another order somewhere
    assert len({answer for answer, _ in by_seed[1]}) > 1  # the correct answer is not always at one letter


@pytest.mark.parametrize(
    ("name", "writer", "column"),
    [
        ("math", lambda p: write_csv(p.with_suffix(".csv"), ["Question", "Solution"], [["Q", "1"]]), "Answer"),
        (
            "mmlu_FR-FR",
            lambda p: write_csv(
                p.with_suffix(".csv"), ["Question", "A", "B", "C", "D", "Answer"], [["Q", 1, 2, 3, 4, "A"]]
            ),
            "Subject",
        ),
        (
            "mmlu_pro",
            lambda p: write_jsonl(p.with_suffix(".jsonl"), [{"question": "Q", "options": ["a"], "answer": "A"}]),
            "category",
        ),
        (
            "gpqa",
            lambda p: write_jsonl(p.with_suffix(".jsonl"), [{"Question": "Q", "Correct Answer": "a"}]),
            "Incorrect Answer 1",
        ),
    ],
)
def test_a_missing_column_is_one_line_naming_the_file_and_the_column(tmp_path, name, writer, column):
    path = writer(tmp_path / "rows")
    with pytest.raises(DataError) as error:
        load_eval_dataset({"dataset_name": name, "data_path": path})
    message = str(error.value)
    assert "\n" not in message and path in message and f"missing column(s) [{column!r}" in message


def test_a_missing_field_names_the_row(tmp_path):
    path = write_csv(
        tmp_path / "mmlu.csv", ["Question", "A", "B", "C", "D", "Answer", "Subject"], [["Q", 1, 2, 3, 4, "", "s"]]
    )
    with pytest.raises(DataError, match=r"^mmlu \(.*mmlu\.csv\): row 0: field 'answer' is missing or empty$"):
        load_eval_dataset({"dataset_name": "mmlu", "data_path": path})


# ---------------------------------------------------------------------------------------------------- prompts
def test_multichoice_prompt_holds_the_instruction_the_question_and_the_lettered_options(tmp_path, tokenizer):
    loaded = load_eval_dataset(
        {
            "dataset_name": "mmlu",
            "data_path": mmlu_file(tmp_path / "mmlu.csv"),
            "prompt_file": "examples/prompts/mmlu.txt",
        }
    )
    assert loaded.task_spec.prompt == (REPO / "examples" / "prompts" / "mmlu.txt").read_text(encoding="utf-8")
    dataset = AllTaskProcessedDataset(
        loaded.rekeyed_ds, tokenizer, loaded.task_spec, loaded.processor, max_seq_length=512
    )
    datum = dataset[0]
    text = datum["message_log"][-1]["content"]
    assert loaded.task_spec.prompt.strip() in text and "Question: 2 + 2?" in text and "Options:" in text
    assert all(f"{letter}) {option}" in text for letter, option in zip("ABCD", ("4", "None", "5", "NA"), strict=True))
    assert datum["extra_env_info"] == {"ground_truth": "A", "subject": "math"} and datum["task_name"] == "math"
    second = dataset[1]["message_log"][-1]["content"]
    assert "C) 3" in second and "D)" not in second  # the empty option is left out

    gpqa = load_eval_dataset(
        {"dataset_name": "gpqa", "data_path": gpqa_file(tmp_path / "g.jsonl", 1), "prompt_file": None}
    )
    gpqa_text = multichoice_qa_processor(gpqa.rekeyed_ds[0], gpqa.task_spec, tokenizer, 512, 0)["message_log"][-1]
    assert GPQA_PROMPT.strip() in gpqa_text["content"] and all(f"{x}) " in gpqa_text["content"] for x in "ABCD")


def test_a_template_prompt_file_is_refused_for_a_multichoice_set(tmp_path):
    path = mmlu_file(tmp_path / "mmlu.csv")
    with pytest.raises(UserInputError, match=r"^data\.prompt_file: 'examples/prompts/cot\.txt' is a '\{\}' template"):
        load_eval_dataset({"dataset_name": "mmlu", "data_path": path, "prompt_file": "examples/prompts/cot.txt"})


# ---------------------------------------------------------------------------------------------- NeMo-RL classes
def test_nemo_rl_classes_import_and_check_their_arguments():
    from nemo_rl_clone.data.datasets.eval_datasets import GPQADataset, MathDataset, MMLUDataset, MMLUProDataset

    for module in ("gpqa", "mmlu", "mmlu_pro", "math"):
        importlib.import_module(f"nemo_rl_clone.data.datasets.eval_datasets.{module}")  # no longer refused
    assert MMLUProDataset.__init__.__defaults__ == (None,)
    with pytest.raises(DataError, match=r"^variant: 'extended' is not a GPQA set"):
        GPQADataset("extended")
    with pytest.raises(DataError, match=r"^language: unknown MMLU language 'EN'"):
        MMLUDataset("EN")
    with pytest.raises(DataError, match=r"^variant: 'math_train' is not a MATH set"):
        MathDataset("math_train")


# ------------------------------------------------------------------------------------------------ config check
def eval_problems(dataset_name: str, verifier_type: str | None) -> list[str]:
    section: dict[str, Any] = {"dataset_name": dataset_name, "prompt_file": None}
    try:
        validate_config({"data": section, "env": {"math": {"verifier_type": verifier_type}}}, EvalMasterConfig)
    except ConfigError as error:
        return error.problems
    return []


@pytest.mark.parametrize(
    ("dataset_name", "verifier_type"),
    [
        ("gpqa", "multilingual_multichoice"),
        ("gpqa_diamond", "english_multichoice"),
        ("mmlu", "multilingual_multichoice"),
        ("mmlu_ZH-CN", "multilingual_multichoice"),
        ("mmlu_pro", "english_multichoice"),
        ("math", None),
        ("math", "math"),
        ("local", "english_multichoice"),  # a local file may hold lettered answers
    ],
)
def test_eval_config_accepts_nemo_rl_s_pairs(dataset_name, verifier_type):
    found = eval_problems(dataset_name, verifier_type)
    assert [p for p in found if "verifier_type" in p] == [], found


@pytest.mark.parametrize(
    ("dataset_name", "verifier_type", "says"),
    [
        ("mmlu_pro", None, "env.math.verifier_type: must be english_multichoice or multilingual_multichoice"),
        ("gpqa", "math", "env.math.verifier_type: must be english_multichoice or multilingual_multichoice"),
        (
            "math",
            "multilingual_multichoice",
            "env.math.verifier_type: 'multilingual_multichoice' scores answer letters",
        ),
        ("math500", "english_multichoice", "env.math.verifier_type: 'english_multichoice' scores answer letters"),
    ],
)
def test_eval_config_refuses_a_verifier_that_does_not_fit_the_answers(dataset_name, verifier_type, says):
    found = eval_problems(dataset_name, verifier_type)
    assert [p for p in found if p.startswith(says) and "\n" not in p], found


def test_run_eval_builds_the_prompts_with_the_set_s_processor(tmp_path, tokenizer):
    from nemo_rl_clone.evals.eval import load_eval_problems

    path = write_jsonl(
        tmp_path / "mmlu_pro.jsonl", [{"question": "Pick b.", "options": ["a", "b"], "answer": "B", "category": "c"}]
    )
    section = {"dataset_name": "mmlu_pro", "data_path": path, "prompt_file": None}
    config = validate_config(
        {"data": section, "env": {"math": {"verifier_type": "english_multichoice"}}}, EvalMasterConfig
    )
    datum = load_eval_problems(config, tokenizer)[0]
    assert "Options:\nA) a\nB) b" in datum["message_log"][-1]["content"] and datum["task_name"] == "math"
    assert datum["extra_env_info"] == {"ground_truth": "B", "subject": "c"}
