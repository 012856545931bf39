"""Dataset loaders on small local files in the real hub formats, the registry, the data config and reasoning-gym."""

from __future__ import annotations

import json

import datasets
import huggingface_hub.constants
import pytest
import reasoning_gym

from nemo_rl_clone.data.config import DataConfig, ReasoningGymDataConfig
from nemo_rl_clone.data.datasets import DATASET_NAMES, load_dataset_by_name, load_dataset_from_config
from nemo_rl_clone.data.datasets.common import DatasetLoadError
from nemo_rl_clone.utils.config_validation import ConfigError, validate_config


# ---------------------------------------------------------------- files in the real formats
def _omi2_rows(n: int) -> list[dict]:
    return [
        {
            "problem": f"What is {i} + {i}?",
            "generated_solution": f"Adding gives \\boxed{{{2 * i}}}.",
            "expected_answer": str(2 * i),
            "problem_source": "augmented_math",
        }
        for i in range(n)
    ]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _aime_rows(n: int) -> list[dict]:
    return [
        {
            "id": 60 + i,
            "problem": f"AIME problem {i}",
            "solution": "...",
            "answer": str(100 + i),
            "url": f"https://artofproblemsolving.com/{i}",
            "year": "2024",
        }
        for i in range(n)
    ]


def _dapo_rows(n: int) -> list[dict]:
    return [
        {
            "data_source": "math_dapo",
            "prompt": [{"content": f"Solve the following math problem step by step. {i} * 3 = ?", "role": "user"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": str(3 * i), "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": f"id-{i}"},
        }
        for i in range(n)
    ]


def _parquet(path, rows):
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return str(path)


def _problems(rows) -> list[str]:
    return [rows[i]["problem"] for i in range(len(rows))]


# ---------------------------------------------------------------- OpenMathInstruct-2
def test_openmathinstruct2_local_file_with_seeded_holdout(tmp_path):
    path = _write_jsonl(tmp_path / "omi2.jsonl", _omi2_rows(20))
    data = load_dataset_by_name("OpenMathInstruct-2", data_path=path, split_validation_size=0.25, seed=1)

    assert (len(data.train), len(data.validation)) == (15, 5)
    assert sorted(data.train.column_names) == ["expected_answer", "problem", "task_name"]
    assert sorted(_problems(data.train) + _problems(data.validation)) == sorted(r["problem"] for r in _omi2_rows(20))
    row = data.validation[0]
    i = int(row["problem"].split()[2])
    assert row == {"problem": f"What is {i} + {i}?", "expected_answer": str(2 * i), "task_name": "math"}

    again = load_dataset_by_name("OpenMathInstruct-2", data_path=path, split_validation_size=0.25, seed=1)
    other = load_dataset_by_name("OpenMathInstruct-2", data_path=path, split_validation_size=0.25, seed=2)
    assert _problems(again.validation) == _problems(data.validation)
    assert _problems(other.validation) != _problems(data.validation)
    # Default hold-out is NeMo-RL's 5%.
    assert len(load_dataset_by_name("OpenMathInstruct-2", data_path=path).validation) == 1


def test_openmathinstruct2_validation_file_and_conflicts(tmp_path):
    path = _write_jsonl(tmp_path / "train.jsonl", _omi2_rows(6))
    val_path = _write_jsonl(tmp_path / "val.jsonl", _omi2_rows(2))
    data = load_dataset_by_name("OpenMathInstruct-2", data_path=path, val_data_path=val_path)
    assert (len(data.train), len(data.validation)) == (6, 2)
    assert load_dataset_by_name("OpenMathInstruct-2", data_path=path, split_validation_size=0.0).validation is None

    with pytest.raises(ValueError, match="either val_data_path or split_validation_size > 0, not both"):
        load_dataset_by_name("OpenMathInstruct-2", data_path=path, val_data_path=val_path, split_validation_size=0.1)
    with pytest.raises(ValueError, match=r"split_validation_size=0.01 of 6 rows leaves 0 validation rows"):
        load_dataset_by_name("OpenMathInstruct-2", data_path=path, split_validation_size=0.01)
    with pytest.raises(ValueError, match=r"split_validation_size must be in \[0, 1\), got 1.5"):
        load_dataset_by_name("OpenMathInstruct-2", data_path=path, split_validation_size=1.5)
    with pytest.raises(ValueError, match=r"unknown split 'train_3M'.*'train_1M'"):
        load_dataset_by_name("OpenMathInstruct-2", split="train_3M")


def test_malformed_rows_name_their_index_and_field(tmp_path):
    rows = _omi2_rows(5)
    rows[3]["expected_answer"] = ""
    path = _write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(
        ValueError, match=r"OpenMathInstruct-2 \(.*bad\.jsonl\): row 3: field 'expected_answer' is missing"
    ):
        load_dataset_by_name("OpenMathInstruct-2", data_path=path)

    rows = _omi2_rows(5)
    rows[4]["problem"] = None
    path = _write_jsonl(tmp_path / "null.jsonl", rows)
    with pytest.raises(ValueError, match=r"row 4: field 'problem' is missing or empty"):
        load_dataset_by_name("OpenMathInstruct-2", data_path=path)

    path = _write_jsonl(tmp_path / "cols.jsonl", [{"question": "q", "expected_answer": "1"}])
    with pytest.raises(
        ValueError, match=r"missing column\(s\) \['problem'\]; the file has \['question', 'expected_answer'\]"
    ):
        load_dataset_by_name("OpenMathInstruct-2", data_path=path)


def test_local_file_errors(tmp_path):
    with pytest.raises(DatasetLoadError, match=r"unsupported file type '\.txt'"):
        load_dataset_by_name("math500", data_path=str(tmp_path / "rows.txt"))
    with pytest.raises(DatasetLoadError, match=r"data file '.*nope\.jsonl' does not exist"):
        load_dataset_by_name("math500", data_path=str(tmp_path / "nope.jsonl"))


def test_hub_unreachable_error_says_how_to_use_a_local_file(monkeypatch):
    # Offline mode makes the hub lookup fail at once, as it does on machines without hub access.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DatasetLoadError, match=r"could not load 'HuggingFaceH4/MATH-500' \(split 'test'\).*data_path"):
        load_dataset_by_name("math500")


# ---------------------------------------------------------------- DeepScaleR, DAPO, AIME 2024, MATH-500
def test_deepscaler_json_with_aime_validation(tmp_path):
    rows = [{"problem": f"Find {i}^2.", "answer": str(i * i), "solution": "Square it."} for i in range(8)]
    path = tmp_path / "deepscaler.json"
    path.write_text(json.dumps(rows))  # a JSON array, as the hub file is
    aime = _parquet(tmp_path / "aime.parquet", _aime_rows(3))

    data = load_dataset_by_name("DeepScaler", data_path=str(path), val_data_path=aime)
    assert len(data.train) == 8 and data.train[5] == {
        "problem": "Find 5^2.",
        "expected_answer": "25",
        "task_name": "math",
    }
    assert _problems(data.validation) == ["AIME problem 0", "AIME problem 1", "AIME problem 2"]

    held_out = load_dataset_by_name("DeepScaler", data_path=str(path), split_validation_size=0.25, seed=0)
    assert (len(held_out.train), len(held_out.validation)) == (6, 2)


def test_dapo_math_parquet(tmp_path):
    rows = _dapo_rows(4)
    path = _parquet(tmp_path / "dapo.parquet", rows)
    aime = _parquet(tmp_path / "aime.parquet", _aime_rows(2))
    data = load_dataset_by_name("DAPOMath17K", data_path=path, val_data_path=aime)
    assert data.train[2] == {"problem": rows[2]["prompt"][0]["content"], "expected_answer": "6", "task_name": "math"}
    assert len(data.validation) == 2

    rows[1]["prompt"] = [{"content": "hi", "role": "system"}]
    path = _parquet(tmp_path / "bad.parquet", rows)
    with pytest.raises(ValueError, match=r"row 1: field 'prompt\[role=user\]\.content' is missing or empty"):
        load_dataset_by_name("DAPOMath17K", data_path=path, val_data_path=aime)


def test_eval_sets_fill_validation_only(tmp_path):
    aime = load_dataset_by_name("aime2024", data_path=_parquet(tmp_path / "aime.parquet", _aime_rows(4)))
    assert aime.train is None and len(aime.validation) == 4
    assert aime.validation[3] == {"problem": "AIME problem 3", "expected_answer": "103", "task_name": "math"}

    rows = [
        {
            "problem": "Compute $1+1$.",
            "solution": "$2$",
            "answer": "2",
            "subject": "Algebra",
            "level": 1,
            "unique_id": "test/algebra/1.json",
        }
    ]
    math500 = load_dataset_by_name("math500", data_path=_write_jsonl(tmp_path / "m.jsonl", rows))
    assert math500.train is None
    assert math500.validation[0] == {"problem": "Compute $1+1$.", "expected_answer": "2", "task_name": "math"}


# ---------------------------------------------------------------- registry and config
def test_unknown_dataset_lists_valid_names():
    with pytest.raises(
        ValueError,
        match=r"unknown dataset 'OpenMathInstruct2' \(did you mean 'OpenMathInstruct-2'\?\); "
        r"valid names: OpenMathInstruct-2, DeepScaler, DAPOMath17K, aime2024, math500, gsm8k, reasoning_gym",
    ):
        load_dataset_by_name("OpenMathInstruct2")
    with pytest.raises(TypeError, match=r"dataset 'math500' does not take \['split'\]; its arguments: \['data_path'\]"):
        load_dataset_by_name("math500", split="test")


def test_load_dataset_from_config(tmp_path):
    path = _write_jsonl(tmp_path / "omi2.jsonl", _omi2_rows(10))
    config = DataConfig(data_path=path, split_validation_size=0.2)
    data = load_dataset_from_config(config, seed=3)
    assert (len(data.train), len(data.validation)) == (8, 2)
    direct = load_dataset_by_name("OpenMathInstruct-2", data_path=path, split_validation_size=0.2, seed=3)
    assert _problems(data.validation) == _problems(direct.validation)

    with pytest.raises(ValueError, match=r"data\.split: not used by dataset 'DeepScaler'"):
        load_dataset_from_config(DataConfig(dataset_name="DeepScaler", data_path=path, split="train"), seed=0)

    rg = ReasoningGymDataConfig(
        task="chain_sum", task_kwargs={"min_terms": 2, "max_terms": 2}, train_size=6, val_size=2
    )
    data = load_dataset_from_config(DataConfig(dataset_name="reasoning_gym", prompt_file=None, reasoning_gym=rg), 0)
    assert (len(data.train), len(data.validation)) == (6, 2)


def test_data_config_schema():
    config = validate_config(
        {"dataset_name": "reasoning_gym", "reasoning_gym": {"task": "products", "task_kwargs": {"max_digits": 1}}},
        DataConfig,
    )
    assert config.reasoning_gym.task_kwargs == {"max_digits": 1} and config.reasoning_gym.train_size == 1000

    with pytest.raises(ConfigError) as err:
        validate_config({"dataset_name": "DeepScaleR", "split_validation_size": 1.0}, DataConfig)
    text = str(err.value)
    assert "dataset_name: unknown dataset 'DeepScaleR' (did you mean 'DeepScaler'?)" in text
    assert "split_validation_size: must be in [0, 1), got 1.0" in text
    with pytest.raises(ConfigError, match="reasoning_gym: must be set exactly when dataset_name is 'reasoning_gym'"):
        validate_config({"dataset_name": "reasoning_gym"}, DataConfig)
    with pytest.raises(ConfigError, match=r"reasoning_gym\.train_size: must be >= 1, got 0"):
        validate_config({"dataset_name": "reasoning_gym", "reasoning_gym": {"train_size": 0}}, DataConfig)
    assert set(DATASET_NAMES) >= {"OpenMathInstruct-2", "DeepScaler", "DAPOMath17K", "aime2024", "math500"}


# ---------------------------------------------------------------- reasoning-gym
ONE_DIGIT_PRODUCTS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}  # only 100 questions


def test_reasoning_gym_validation_never_shares_a_question_with_training():
    data = load_dataset_by_name(
        "reasoning_gym", task="products", task_kwargs=ONE_DIGIT_PRODUCTS, train_size=60, val_size=25, seed=5
    )
    train_questions = {row["extra_env_info"]["entry"]["question"] for row in data.train}
    val_questions = [row["extra_env_info"]["entry"]["question"] for row in data.validation]
    assert len(data.train) == 60 and len(val_questions) == 25
    assert len(set(val_questions)) == 25 and not train_questions & set(val_questions)
    # Naive seeding (seed and seed + 1) would share all but one item: the overlap this loader avoids.
    naive_train = reasoning_gym.create_dataset("products", size=60, seed=5, **ONE_DIGIT_PRODUCTS)
    naive_val = reasoning_gym.create_dataset("products", size=25, seed=6, **ONE_DIGIT_PRODUCTS)
    assert {e["question"] for e in naive_val} <= {e["question"] for e in naive_train}

    again = load_dataset_by_name(
        "reasoning_gym", task="products", task_kwargs=ONE_DIGIT_PRODUCTS, train_size=60, val_size=25, seed=5
    )
    assert _problems(again.train) == _problems(data.train) and _problems(again.validation) == _problems(data.validation)


def test_reasoning_gym_validation_is_a_plain_sample_independent_of_train_size():
    # Validation is drawn before training, so it does not depend on train_size and is not the leftovers of training.
    small = load_dataset_by_name(
        "reasoning_gym", task="products", task_kwargs=ONE_DIGIT_PRODUCTS, train_size=5, val_size=25
    )
    large = load_dataset_by_name(
        "reasoning_gym", task="products", task_kwargs=ONE_DIGIT_PRODUCTS, train_size=90, val_size=25
    )
    assert _problems(small.validation) == _problems(large.validation)


def test_reasoning_gym_rows_score_with_the_task_scorer():
    data = load_dataset_by_name(
        "reasoning_gym", task="chain_sum", task_kwargs={"min_terms": 2, "max_terms": 3}, train_size=5, val_size=3
    )
    row = data.train[0]
    entry = row["extra_env_info"]["entry"]
    assert row["task_name"] == "reasoning_gym" and row["extra_env_info"]["task"] == "chain_sum"
    assert row["problem"] == entry["question"] and row["expected_answer"] == entry["answer"]
    score = reasoning_gym.get_score_answer_fn(entry["metadata"]["source_dataset"])
    assert score(row["expected_answer"], entry) == 1.0
    assert score("not a number", entry) == 0.0


def test_reasoning_gym_one_shot_example():
    data = load_dataset_by_name(
        "reasoning_gym",
        task="products",
        task_kwargs=ONE_DIGIT_PRODUCTS,
        train_size=10,
        val_size=10,
        one_shot_example=True,
    )
    prompts = _problems(data.train) + _problems(data.validation)
    example_block = prompts[0].split("\n\nQuestion: ")[0]
    assert "Answer: <answer>" in example_block and "</answer>" in example_block
    assert all(p.startswith(example_block) for p in prompts)  # one fixed example for every prompt
    example_question = example_block.split("Question: ")[1].split("\n")[0]
    assert example_question not in {row["extra_env_info"]["entry"]["question"] for row in data.validation}
    row = data.validation[4]
    assert row["problem"].endswith(f"Question: {row['extra_env_info']['entry']['question']}\nAnswer:")


def test_reasoning_gym_errors():
    with pytest.raises(
        ValueError,
        match=r"unknown task 'basic_arithmatic' \(did you mean 'basic_arithmetic'\?\); "
        r"valid tasks: .*chain_sum",
    ):
        load_dataset_by_name("reasoning_gym", task="basic_arithmatic")
    with pytest.raises(ValueError, match=r"cannot create task 'products' with task_kwargs \{'digits': 1\}"):
        load_dataset_by_name("reasoning_gym", task="products", task_kwargs={"digits": 1})
    with pytest.raises(ValueError, match=r"yielded only 100 of 101 usable validation questions"):
        load_dataset_by_name("reasoning_gym", task="products", task_kwargs=ONE_DIGIT_PRODUCTS, val_size=101)
