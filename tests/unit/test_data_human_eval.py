"""HumanEval loader (package data and local files), its registration, and the code data processor."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from nemo_rl_clone.data.config import DataConfig
from nemo_rl_clone.data.datasets import DataError, load_dataset_from_config
from nemo_rl_clone.data.datasets.common import AllTaskProcessedDataset
from nemo_rl_clone.data.datasets.human_eval import load_human_eval
from nemo_rl_clone.data.interfaces import TaskDataSpec
from nemo_rl_clone.data.processors import code_data_processor

PROBLEM = {
    "task_id": "Local/0",
    "prompt": 'def double(x: int) -> int:\n    """Twice x."""\n',
    "canonical_solution": "    return 2 * x\n",
    "test": "def check(candidate):\n    assert candidate(2) == 4\n",
    "entry_point": "double",
}


def write_jsonl(path: Path, rows: list[Any]) -> str:
    text = "".join(json.dumps(row) + "\n" for row in rows)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt") as file:
            file.write(text)
    else:
        path.write_text(text)
    return str(path)


def test_package_data_is_an_evaluation_set_of_164_problems() -> None:
    loaded = load_human_eval()
    assert loaded.name == "human_eval" and loaded.train is None
    rows = loaded.validation
    assert rows is not None and len(rows) == 164
    first = rows[0]
    assert set(first) == {"problem", "expected_answer", "task_name", "extra_env_info"}
    assert first["task_name"] == "code" and first["expected_answer"] == ""
    info = first["extra_env_info"]
    assert set(info) == {"task_id", "prompt", "test", "entry_point"}
    assert (info["task_id"], info["entry_point"]) == ("HumanEval/0", "has_close_elements")
    assert "def check(candidate)" in info["test"]
    assert info["prompt"] in first["problem"] and "```python" in first["problem"]
    assert len({row["extra_env_info"]["task_id"] for row in rows}) == 164


def test_seeded_split_and_all_training_rows() -> None:
    loaded = load_human_eval(split_validation_size=0.25, seed=3)
    assert loaded.train is not None and loaded.validation is not None
    assert (len(loaded.train), len(loaded.validation)) == (123, 41)
    train_ids = {row["extra_env_info"]["task_id"] for row in loaded.train}
    val_ids = [row["extra_env_info"]["task_id"] for row in loaded.validation]
    assert train_ids.isdisjoint(val_ids)
    again = load_human_eval(split_validation_size=0.25, seed=3).validation
    assert again is not None and [row["extra_env_info"]["task_id"] for row in again] == val_ids
    everything = load_human_eval(split_validation_size=0.0)
    assert everything.train is not None and len(everything.train) == 164 and everything.validation is None


@pytest.mark.parametrize("name", ["problems.jsonl", "problems.jsonl.gz"])
def test_local_file(tmp_path: Path, name: str) -> None:
    path = write_jsonl(tmp_path / name, [PROBLEM, {**PROBLEM, "task_id": "Local/1"}])
    rows = load_human_eval(data_path=path).validation
    assert rows is not None and [row["extra_env_info"]["task_id"] for row in rows] == ["Local/0", "Local/1"]
    assert rows[0]["extra_env_info"]["test"] == PROBLEM["test"]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([PROBLEM, {**PROBLEM, "test": ""}], r"row 1 \(task_id 'Local/0'\): field 'test' is missing, empty"),
        ([PROBLEM, PROBLEM, {"prompt": "x"}], r"row 2 \(task_id None\): field 'task_id' is missing"),
        ([{**PROBLEM, "entry_point": "not a name"}], r"row 0: field 'entry_point' must be a function name"),
        ([["a list"]], r"row 0: expected a JSON object, got list"),
        ([PROBLEM, PROBLEM], r"task_id\(s\) \['Local/0'\] appear more than once"),
        ([], r"the file has no rows"),
    ],
)
def test_bad_rows_name_the_file_and_row(tmp_path: Path, rows: list[Any], message: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DataError, match=rf"human_eval \({tmp_path}/bad\.jsonl\): {message}"):
        load_human_eval(data_path=path)


def test_unreadable_files(tmp_path: Path) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(PROBLEM) + "\n{not json\n")
    with pytest.raises(DataError, match=r"broken\.jsonl\): row 1: not valid JSON"):
        load_human_eval(data_path=str(broken))
    with pytest.raises(DataError, match=r"missing\.jsonl\): data file does not exist"):
        load_human_eval(data_path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(DataError, match=r"unsupported file type"):
        load_human_eval(data_path=str(tmp_path / "problems.csv"))


def test_registered_and_loaded_from_config(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{**PROBLEM, "task_id": f"Local/{i}"} for i in range(4)])
    config = DataConfig(dataset_name="human_eval", data_path=path, split_validation_size=0.5)
    loaded = load_dataset_from_config(config, seed=1)
    assert loaded.train is not None and loaded.validation is not None
    assert (len(loaded.train), len(loaded.validation)) == (2, 2)
    with pytest.raises(DataError, match=r"data\.val_data_path: not used by dataset 'human_eval'"):
        load_dataset_from_config(DataConfig(dataset_name="human_eval", val_data_path=path), seed=1)


def test_code_data_processor_keeps_what_the_environment_runs() -> None:
    from nemo_rl_clone.models.huggingface import load_tokenizer

    tokenizer = load_tokenizer("tiny-random-llama")
    rows = load_human_eval().validation
    assert rows is not None
    dataset = AllTaskProcessedDataset(rows, tokenizer, TaskDataSpec("code"), max_seq_length=4096)
    datum = dataset[0]
    assert datum["task_name"] == "code" and datum["loss_multiplier"] == 1.0
    assert datum["extra_env_info"] == rows[0]["extra_env_info"]
    assert datum["message_log"][-1]["content"].count("has_close_elements") >= 1
    with pytest.raises(DataError, match=r"row 7: code rows need extra_env_info"):
        code_data_processor({"problem": "p", "extra_env_info": {"prompt": "x"}}, TaskDataSpec("code"), tokenizer, 64, 7)
