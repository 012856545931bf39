"""The offline champ SFT and preference sets, checked against the package's own JSON file read independently."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from nemo_rl_clone.data.config import PreferenceDataConfig, SFTDataConfig
from nemo_rl_clone.data.supervised import PreferenceDataset, SFTDataset, load_preference_dataset, load_sft_dataset
from nemo_rl_clone.models.huggingface import load_tokenizer


@pytest.fixture(scope="module")
def problems():
    return json.loads(resources.files("champ_dataset").joinpath("dataset_files", "v0.json").read_text())["problems"]


def _wrong_annotations(problem):
    return [a for a in problem["fws_annotations"].values() if a["start_idx"] is not None]


def test_champ_sft_holds_out_ten_percent_of_problems(problems):
    loaded = load_sft_dataset(SFTDataConfig(dataset_name="champ"), seed=42)
    train_ids = [r["problem_id"] for r in loaded.train]
    val_ids = [r["problem_id"] for r in loaded.validation]
    assert len(problems) == 270 and (len(train_ids), len(val_ids)) == (243, 27)
    assert set(train_ids).isdisjoint(val_ids) and set(train_ids) | set(val_ids) == set(problems)

    row = next(r for r in loaded.train if r["problem_id"] == "P_Combinatorics_1")
    user, assistant = row["messages"]
    assert user == {"role": "user", "content": problems["P_Combinatorics_1"]["_text"]}
    assert assistant["role"] == "assistant" and assistant["content"].endswith("\nThe answer is 239.")
    assert assistant["content"].startswith("Let x_n, y_n, z_n be the number of length-n strings")
    assert not any("@@" in m["content"] for r in loaded.train for m in r["messages"])

    again = load_sft_dataset(SFTDataConfig(dataset_name="champ"), seed=42)
    assert [r["problem_id"] for r in again.validation] == val_ids
    other = load_sft_dataset(SFTDataConfig(dataset_name="champ"), seed=7)
    assert [r["problem_id"] for r in other.validation] != val_ids
    none = load_sft_dataset(SFTDataConfig(dataset_name="champ", split_validation_size=0.0), seed=42)
    assert len(none.train) == 270 and none.validation is None


def test_champ_preference_pairs_reference_against_wrong_solutions(problems):
    loaded = load_preference_dataset(PreferenceDataConfig(dataset_name="champ"), seed=42)
    sft = load_sft_dataset(SFTDataConfig(dataset_name="champ"), seed=42)
    expected_pairs = sum(len(_wrong_annotations(p)) for p in problems.values())
    assert expected_pairs == 444 and len(loaded.train) + len(loaded.validation) == expected_pairs
    val_problems = {r["problem_id"] for r in loaded.validation}
    assert val_problems.isdisjoint(r["problem_id"] for r in loaded.train)
    # Same seed: the preference hold-out lies inside the SFT hold-out (problems without a wrong solution add no pair).
    assert val_problems <= {r["problem_id"] for r in sft.validation}

    reference = {r["problem_id"]: r["messages"][1]["content"] for r in sft.train + sft.validation}
    for row in loaded.train + loaded.validation:
        assert row["context"] == [{"role": "user", "content": problems[row["problem_id"]]["_text"]}]
        assert row["chosen"] == [{"role": "assistant", "content": reference[row["problem_id"]]}]
        assert row["rejected"][0]["role"] == "assistant" and row["rejected"] != row["chosen"]
    wrong_texts = {a["text"] for p in problems.values() for a in _wrong_annotations(p)}
    assert {r["rejected"][0]["content"] for r in loaded.train + loaded.validation} == wrong_texts


def test_champ_rows_tokenise(problems):
    tokenizer = load_tokenizer("tiny-random-llama")
    sft = load_sft_dataset(SFTDataConfig(dataset_name="champ"), seed=42)
    pref = load_preference_dataset(PreferenceDataConfig(dataset_name="champ"), seed=42)
    datum = SFTDataset(sft.validation, tokenizer, max_seq_length=1024)[0]
    assert datum["loss_multiplier"] == 1.0 and 50 < datum["length"] <= 1024
    pair = PreferenceDataset(pref.validation, tokenizer, max_seq_length=4096)[0]
    assert pair["loss_multiplier"] == 1.0 and pair["length_chosen"] != pair["length_rejected"]
