"""NeMo-RL v0.7.0's dataset classes and loaders at its paths (``nemo_rl.data.datasets.*``): each class built from
NeMo-RL's arguments on a small local file (there is no hub here) gives NeMo-RL's rows, and the loaders bind NeMo-RL's
prompt spec and processor."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import datasets
import pytest
import torch

from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.data.datasets.preference_datasets import (
    BinaryPreferenceDataset,
    Tulu3PreferenceDataset,
    load_preference_dataset,
)
from nemo_rl_clone.data.datasets.preference_datasets import HelpSteer3Dataset as HelpSteer3Preference
from nemo_rl_clone.data.datasets.processed_dataset import AllTaskProcessedDataset
from nemo_rl_clone.data.datasets.raw_dataset import RawDataset, task_name_from_path
from nemo_rl_clone.data.datasets.response_datasets import (
    DATASET_REGISTRY,
    DAPOMathAIME2024Dataset,
    GSM8KDataset,
    HelpSteer3Dataset,
    NemotronCascade2SFTMathDataset,
    OpenAIFormatDataset,
    OpenMathInstruct2Dataset,
    ResponseDataset,
    SquadDataset,
    Tulu3SftMixtureDataset,
    load_response_dataset,
)
from nemo_rl_clone.data.datasets.response_datasets.oai_format_dataset import PreservingDataset
from nemo_rl_clone.data.datasets.response_datasets.oasst import SYSTEM_PROMPT, OasstDataset, get_data_records
from nemo_rl_clone.data.datasets.utils import (
    assert_no_double_bos,
    extract_necessary_env_names,
    load_dataset_from_path,
    merge_datasets,
    resolve_external_dataset_class,
    update_single_dataset_config,
)
from nemo_rl_clone.data.processors import sft_processor
from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer
from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.utils.unsupported_modules import UnsupportedFeatureError


def jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def user_assistant(user: str, assistant: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]


# ------------------------------------------------------------------------------------------------- utils
def test_dataset_config_helpers():
    entry = {"dataset_name": "squad"}
    update_single_dataset_config(entry, {"dataset_name": "x", "processor": "sft_processor"})
    assert entry == {"dataset_name": "squad", "processor": "sft_processor"}  # only missing keys filled
    data = {"train": {"env_name": "math"}, "validation": {"env_name": "math"}, "default": {"env_name": "code"}}
    assert sorted(extract_necessary_env_names(data)) == ["code", "math"]
    assert extract_necessary_env_names({"train": {"dataset_name": "squad"}, "validation": None}) == []
    first, second = datasets.Dataset.from_list([{"a": 1}]), datasets.Dataset.from_list([{"a": 2}, {"a": 3}])
    assert merge_datasets([first, second])["a"] == [1, 2, 3] and merge_datasets([first]) is first
    mixed = merge_datasets([first, PreservingDataset([{"a": 9}])])
    assert isinstance(mixed, torch.utils.data.ConcatDataset) and mixed[1] == {"a": 9}
    with pytest.raises(ValueError, match="at least one"):
        merge_datasets([])


def test_resolve_external_dataset_class():
    assert (
        resolve_external_dataset_class("collections.OrderedDict") is importlib.import_module("collections").OrderedDict
    )
    with pytest.raises(DataError, match=r"^data\.dataset_name: module 'collections' has no attribute 'Nope'"):
        resolve_external_dataset_class("collections.Nope")
    with pytest.raises(DataError, match="not a dataset class"):
        resolve_external_dataset_class("os.path.join")
    with pytest.raises(DataError, match="could not import module 'no_such_pkg'"):
        resolve_external_dataset_class("no_such_pkg.Data")


def test_assert_no_double_bos_and_refused_helpers():
    tokenizer = load_tokenizer(TINY_LLAMA)
    bos = tokenizer.bos_token_id
    assert_no_double_bos(torch.tensor([bos, 5, bos]), tokenizer)  # BOS later in the text is fine
    assert_no_double_bos(torch.tensor([bos]), tokenizer)
    with pytest.raises(AssertionError, match="double BOS"):
        assert_no_double_bos(torch.tensor([bos, bos, 5]), tokenizer)
    utils = importlib.import_module("nemo_rl_clone.data.datasets.utils")
    with pytest.raises(UnsupportedFeatureError, match="pil_to_base64: not supported yet: vision"):
        utils.pil_to_base64  # noqa: B018
    with pytest.raises(UnsupportedFeatureError, match="clevr: not supported yet"):
        importlib.import_module("nemo_rl_clone.data.datasets.response_datasets.clevr")


def test_load_dataset_from_path(tmp_path):
    path = jsonl(tmp_path / "rows.jsonl", [{"input": "a", "output": "b"}, {"input": "c", "output": "d"}])
    for given in (path, str(path)):  # a pathlib.Path or a str
        assert load_dataset_from_path(given)["input"] == ["a", "c"]
    assert len(load_dataset_from_path(path, data_split=None)) == 2  # no split asked: the file's train rows
    with pytest.raises(DataError, match=r"^data\.split: .* has no split 'test'"):
        load_dataset_from_path(path, data_split="test")
    with pytest.raises(DataError, match=r"^data\.subset: 'main' is only for hub datasets"):
        load_dataset_from_path(path, data_subset="main")
    with pytest.raises(DataError, match=r"^data\.data_path: file .*missing\.jsonl' does not exist"):
        load_dataset_from_path(tmp_path / "missing.jsonl")
    saved = tmp_path / "saved"
    datasets.Dataset.from_list([{"x": 1}]).save_to_disk(str(saved))
    assert load_dataset_from_path(saved, data_split=None)["x"] == [1]


# ------------------------------------------------------------------------------------------------- RawDataset
def test_raw_dataset_split_and_task_name():
    raw = RawDataset()
    raw.dataset, raw.val_dataset = datasets.Dataset.from_list([{"i": i} for i in range(10)]), None
    raw.split_train_validation(0, seed=1)
    assert len(raw.dataset) == 10 and raw.val_dataset is None
    raw.split_train_validation(2.0, seed=1)  # a whole count given as a float: 2 rows, not a fraction
    assert (len(raw.dataset), len(raw.val_dataset)) == (8, 2)
    expected = datasets.Dataset.from_list([{"i": i} for i in range(10)]).train_test_split(test_size=0.3, seed=7)
    again = RawDataset()
    again.dataset = datasets.Dataset.from_list([{"i": i} for i in range(10)])
    again.split_train_validation(0.3, seed=7)
    assert again.val_dataset["i"] == expected["test"]["i"]  # NeMo-RL's seeded split, row for row
    assert task_name_from_path("data/math/train.jsonl") == "math-train"
    assert task_name_from_path(Path("/train.jsonl")) == "train" and task_name_from_path("t.v1.jsonl") == "t"


# ------------------------------------------------------------------------------------------------- response datasets
def test_response_dataset_from_a_file(tmp_path):
    path = jsonl(tmp_path / "qa" / "train.jsonl", [{"q": f"q{i}", "a": f"a{i}"} for i in range(10)])
    data = ResponseDataset(path, input_key="q", output_key="a", split_validation_size=0.2, seed=3)
    assert data.task_name == "qa-train" and (len(data.dataset), len(data.val_dataset)) == (8, 2)
    row = data.format_data({"q": "x", "a": "y"})
    assert row == {"messages": user_assistant("x", "y"), "task_name": "qa-train"}
    chat = jsonl(tmp_path / "chat.jsonl", [{"messages": user_assistant("u", "v")}])
    kept = ResponseDataset(str(chat))
    assert kept.dataset[0] == {"messages": user_assistant("u", "v"), "task_name": f"{tmp_path.name}-chat"}
    assert kept.val_dataset is None


def test_load_response_dataset_binds_spec_and_processor(tmp_path):
    path = jsonl(tmp_path / "d" / "sft.jsonl", [{"input": "2+2?", "output": "4"}])
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Q: {}")
    entry = {"dataset_name": "ResponseDataset", "data_path": str(path), "processor": "sft_processor"}
    entry["prompt_file"] = str(prompt)
    data = load_response_dataset(entry)
    assert isinstance(data, ResponseDataset) and data.processor is sft_processor and data.data_config == entry
    assert (data.task_spec.task_name, data.task_spec.prompt) == ("d-sft", "Q: {}")
    tokenizer = load_tokenizer(TINY_LLAMA)
    processed = AllTaskProcessedDataset(
        data.dataset, tokenizer, None, {data.task_name: (data.task_spec, data.processor)}, max_seq_length=64
    )
    datum = processed[0]
    assert tokenizer.decode(datum["message_log"][0]["token_ids"]).count("Q: 2+2?") == 1  # the prompt file applied
    assert datum["message_log"][-1]["token_loss_mask"].all() and datum["extra_env_info"] is None
    assert processed.encode_single("hi there") == (tokenizer.encode("hi there", add_special_tokens=False), 2)
    ids, count = processed.encode_single(["hi", "there"])
    assert ids.tolist() == tokenizer.encode("hi", add_special_tokens=False) + tokenizer.encode(
        "there", add_special_tokens=False
    ) and count == len(ids)
    with pytest.raises(UserInputError, match=r"^data\.processor: not supported yet: 'no_such_processor'"):
        load_response_dataset({**entry, "processor": "no_such_processor"})


def test_load_response_dataset_names(tmp_path):
    with pytest.raises(DataError, match=r"^data\.dataset_name: unknown dataset 'Squad' \(did you mean 'squad'\?\)"):
        load_response_dataset({"dataset_name": "Squad"})
    with pytest.raises(UnsupportedFeatureError, match="'clevr-cogent': not supported yet: vision"):
        load_response_dataset({"dataset_name": "clevr-cogent"})
    with pytest.raises(UnsupportedFeatureError, match="NeMo-Gym"):
        load_response_dataset({"dataset_name": "NemoGymDataset"})
    assert DATASET_REGISTRY["OpenMathInstruct-2"] is OpenMathInstruct2Dataset
    path = jsonl(tmp_path / "s.jsonl", [{"context": "C", "question": "Q?", "answers": {"text": ["A", "B"]}}])
    external = "nemo_rl_clone.data.datasets.response_datasets.squad.SquadDataset"  # a class by its dotted path
    data = load_response_dataset({"dataset_name": external, "data_path": str(path), "processor": "sft_processor"})
    assert data.dataset[0]["messages"] == [
        {"role": "system", "content": "C"},
        {"role": "user", "content": "Q?"},
        {"role": "assistant", "content": "A"},  # the first answer
    ]


def test_math_datasets_from_local_files(tmp_path):
    dapo = jsonl(
        tmp_path / "dapo.jsonl", [{"prompt": [{"role": "user", "content": "P"}], "reward_model": {"ground_truth": "7"}}]
    )
    aime = DAPOMathAIME2024Dataset(data_path=dapo)
    assert aime.dataset[0] == {"messages": user_assistant("P", "7"), "task_name": "DAPOMathAIME2024"}
    gsm = jsonl(tmp_path / "gsm.jsonl", [{"question": "3+4?", "answer": "3+4=7\n#### 7 "}])
    assert GSM8KDataset(data_path=gsm).dataset[0]["messages"] == user_assistant("3+4?", "7")
    whole = GSM8KDataset(data_path=gsm, extract_answer=False).dataset[0]["messages"][1]["content"]
    assert whole == "3+4=7\n#### 7 "
    omi = jsonl(
        tmp_path / "omi.jsonl",
        [{"problem": f"p{i}", "expected_answer": str(i), "generated_solution": f"s{i}"} for i in range(20)],
    )
    rl = OpenMathInstruct2Dataset(data_path=omi)  # 5% held out by default
    assert (len(rl.dataset), len(rl.val_dataset)) == (19, 1) and rl.dataset[0]["task_name"] == "OpenMathInstruct-2"
    sft = OpenMathInstruct2Dataset(output_key="generated_solution", split_validation_size=0, data_path=omi)
    assert sft.dataset[3]["messages"] == user_assistant("p3", "s3") and sft.val_dataset is None
    with pytest.raises(DataError, match=r"^data\.split: 'test' is not an OpenMathInstruct-2 split"):
        OpenMathInstruct2Dataset(split="test")


def test_chat_datasets_from_local_files(tmp_path):
    rows = [{"id": i, "source": "s", "messages": user_assistant(f"u{i}", f"a{i}")} for i in range(10)]
    tulu = Tulu3SftMixtureDataset(
        max_samples=4, split_validation_size=0.25, seed=1, data_path=jsonl(tmp_path / "t.jsonl", rows)
    )
    assert (len(tulu.dataset), len(tulu.val_dataset)) == (3, 1)
    assert set(tulu.dataset.column_names) == {"messages", "task_name"}  # id and source dropped
    cascade = NemotronCascade2SFTMathDataset(split_validation_size=0, data_path=tmp_path / "t.jsonl")
    assert cascade.dataset[0] == {"messages": user_assistant("u0", "a0"), "task_name": "Nemotron-Cascade-2-SFT-Math"}
    with pytest.raises(DataError, match="last message must be the assistant's"):
        cascade.format_data({"messages": [{"role": "user", "content": "u"}]})
    oai = jsonl(
        tmp_path / "o" / "tools.jsonl",
        [
            {"messages": user_assistant("u", "a"), "tools": [{"name": "calc", "args": {"x": 1}}]},
            {"messages": user_assistant("v", "b"), "tools": [{"name": "find", "args": {"q": "z"}}]},
        ],
    )
    kept = OpenAIFormatDataset(oai, system_prompt="S", use_preserving_dataset=True)
    assert kept.task_name == "o-tools" and kept.dataset[1]["tools"] == [{"name": "find", "args": {"q": "z"}}]
    assert kept.dataset[-1]["messages"][0] == {"role": "system", "content": "S"} and len(kept.dataset[0:2]) == 2
    with pytest.warns(UserWarning, match="use_preserving_dataset=True"):
        filled = OpenAIFormatDataset(str(oai))
    assert filled.dataset[0]["tools"][0]["name"] == "calc" and filled.dataset[1]["task_name"] == "o-tools"


def test_oasst_conversation_trees(tmp_path):
    leaf = {"text": "fine", "role": "assistant", "replies": []}
    tree = {
        "prompt": {
            "text": "hi",
            "role": "prompter",
            "replies": [
                leaf,
                {"text": "ok", "role": "assistant", "replies": [{"text": "why?", "role": "prompter", "replies": []}]},
            ],
        }
    }
    records = get_data_records([tree, {"prompt": {"text": "lonely", "role": "prompter", "replies": []}}])
    system = {"role": "system", "content": SYSTEM_PROMPT}
    assert [r["messages"] for r in records] == [
        [system, *user_assistant("hi", "fine")],
        [system, *user_assistant("hi", "ok"), {"role": "user", "content": "why?"}],
    ]  # the lonely prompt (system + one message) is dropped
    data = OasstDataset(split_validation_size=0, data_path=jsonl(tmp_path / "trees.jsonl", [tree]))
    assert len(data.dataset) == 2 and data.dataset[0]["task_name"] == "oasst"


def test_helpsteer3_response_and_preference_forms(tmp_path):
    rows = [{"context": "c", "response1": "r1", "response2": "r2", "overall_preference": pref} for pref in (-2, 0, 3)]
    path = jsonl(tmp_path / "hs3.jsonl", rows)
    response = HelpSteer3Dataset(data_path=path)
    assert [r["response"][0]["content"] for r in response.dataset] == ["r1", "r1", "r2"]
    assert response.dataset[0]["context"] == [{"role": "user", "content": "c"}]
    preference = HelpSteer3Preference(data_path=path)
    pairs = [[c["completion"][0]["content"] for c in row["completions"]] for row in preference.dataset]
    assert pairs == [["r1", "r2"], ["r1", "r1"], ["r2", "r1"]]  # chosen (rank 0), rejected (rank 1); a tie: r1 twice
    assert [c["rank"] for c in preference.dataset[0]["completions"]] == [0, 1]


def test_preference_loaders(tmp_path):
    binary = jsonl(tmp_path / "p" / "bin.jsonl", [{"q": "Q", "good": "G", "bad": "B"}])
    data = load_preference_dataset(
        {
            "dataset_name": "BinaryPreferenceDataset",
            "data_path": str(binary),
            "prompt_key": "q",
            "chosen_key": "good",
            "rejected_key": "bad",
        }
    )
    assert isinstance(data, BinaryPreferenceDataset) and data.task_spec.task_name == "p-bin"
    assert data.dataset[0] == {
        "context": [{"role": "user", "content": "Q"}],
        "completions": [
            {"rank": 0, "completion": [{"role": "assistant", "content": "G"}]},
            {"rank": 1, "completion": [{"role": "assistant", "content": "B"}]},
        ],
        "task_name": "p-bin",
    }
    ranked = jsonl(tmp_path / "rank.jsonl", [{key: data.dataset[0][key] for key in ("context", "completions")}])
    as_is = load_preference_dataset({"dataset_name": "PreferenceDataset", "data_path": ranked})
    assert (
        as_is.dataset[0]["completions"] == data.dataset[0]["completions"]
        and as_is.dataset[0]["task_name"] == f"{tmp_path.name}-rank"
    )
    chosen = [{"role": "user", "content": "U"}, {"role": "assistant", "content": "yes"}]
    tulu = Tulu3PreferenceDataset(
        data_path=jsonl(
            tmp_path / "tp.jsonl", [{"chosen": chosen, "rejected": [chosen[0], {"role": "assistant", "content": "no"}]}]
        )
    )
    assert tulu.dataset[0]["context"] == chosen[:1]
    assert [c["completion"][0]["content"] for c in tulu.dataset[0]["completions"]] == ["yes", "no"]
    with pytest.raises(DataError, match="differ before their last message"):
        tulu.format_data({"chosen": chosen, "rejected": [{"role": "user", "content": "other"}, chosen[1]]})
    with pytest.raises(DataError, match="unknown dataset 'Tulu3'"):
        load_preference_dataset({"dataset_name": "Tulu3"})


def test_squad_class_reads_the_rows_our_squad_loader_reads(tmp_path):
    from nemo_rl_clone.data.config import SFTDataConfig
    from nemo_rl_clone.data.datasets.sft import load_sft_dataset

    path = jsonl(
        tmp_path / "squad.jsonl",
        [{"context": f"c{i}", "question": f"q{i}", "answers": {"text": [f"a{i}"]}} for i in range(3)],
    )
    ours = load_sft_dataset(SFTDataConfig(dataset_name="squad", data_path=str(path), val_data_path=str(path)), seed=0)
    assert [row["messages"] for row in SquadDataset(data_path=path).dataset] == list(ours.train["messages"])


# ------------------------------------------------------------------------------------------------- eval datasets
def test_eval_dataset_classes(tmp_path):
    from nemo_rl_clone.data.datasets.eval_datasets import AIMEDataset, LocalMathDataset, MathDataset

    path = jsonl(tmp_path / "eval.jsonl", [{"q": "1+1?", "a": "2"}, {"q": "2+3?", "a": "5"}])
    local = LocalMathDataset(path, problem_key="q", solution_key="a", file_format="jsonl")
    assert local.rekeyed_ds["problem"] == ["1+1?", "2+3?"] and local.rekeyed_ds["expected_answer"] == ["2", "5"]
    assert local.task_spec.task_name == "math" and local.preprocessor is None
    with pytest.raises(UserInputError, match=r"^data\.dataset_name: not supported yet: NeMo-RL's 'aime2025'"):
        AIMEDataset()  # NeMo-RL's default year is not shipped here
    with pytest.raises(DataError, match=r"^variant: 'math_train' is not a MATH set"):
        MathDataset("math_train")  # math_test (the full MATH test set): tests/unit/test_eval_multichoice_datasets.py
    with pytest.raises(UnsupportedFeatureError, match=r"eval_datasets\.mmau: not supported yet"):
        importlib.import_module("nemo_rl_clone.data.datasets.eval_datasets.mmau")


def test_aime_validation_set_repeats_the_whole_set(tmp_path):
    path = jsonl(
        tmp_path / "aime.jsonl", [{"problem": "P1", "answer": "1", "id": 7}, {"problem": "P2", "answer": "2", "id": 8}]
    )
    data = load_response_dataset(
        {"dataset_name": "AIME2024", "repeat": 3, "data_path": str(path), "processor": "sft_processor"}
    )
    assert [row["messages"][0]["content"] for row in data.dataset] == ["P1", "P2"] * 3  # set after set
    assert data.dataset[1] == {"messages": user_assistant("P2", "2"), "task_name": "AIME2024"}
    with pytest.raises(DataError, match=r"^variant: not supported yet: AIME '2025'"):
        load_response_dataset({"dataset_name": "AIME2024", "variant": "2025"})
    with pytest.raises(UnsupportedFeatureError, match="'arrow_text': not supported yet: off-policy"):
        load_response_dataset({"dataset_name": "arrow_text"})
