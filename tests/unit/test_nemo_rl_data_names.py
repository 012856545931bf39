"""NeMo-RL v0.7.0's data plumbing names at its paths: packers and their metrics, processors over NeMo-RL's row
formats, the preference collate function, ``data.utils``'s dataloader-state helpers, the ``data`` config types, and
the names refused because their feature is not built. Expected values are worked out by hand in the comments."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
import yaml

from nemo_rl_clone.data.interfaces import TaskDataSpec
from nemo_rl_clone.data.packing.algorithms import (
    ConcatenativePacker,
    FirstFitDecreasingPacker,
    FirstFitShufflePacker,
    ModifiedFirstFitDecreasingPacker,
    PackingAlgorithm,
    get_packer,
)
from nemo_rl_clone.data.packing.metrics import PackingMetrics
from nemo_rl_clone.distributed.sequence_packing import first_fit
from nemo_rl_clone.utils.unsupported_modules import UnsupportedFeatureError

LENGTHS = [4, 1, 3, 2, 1, 3, 4, 5]


# ---------------------------------------------------------------- packers
def test_concatenative_packer_cuts_in_order():
    assert get_packer("concatenative", 5).pack(LENGTHS) == [[0, 1], [2, 3], [4, 5], [6], [7]]
    assert get_packer("concatenative", 8).pack(LENGTHS) == [[0, 1, 2], [3, 4, 5], [6], [7]]
    limited = ConcatenativePacker(8)
    limited.max_sequences_per_bin = 2
    assert limited.pack(LENGTHS) == [[0, 1], [2, 3], [4, 5], [6], [7]]


def test_first_fit_decreasing_takes_longest_first_later_index_first_on_ties():
    # order (length, index) descending: 7(5) 6(4) 0(4) 5(3) 2(3) 3(2) 4(1) 1(1); bins of 5
    # 7 → b0 full; 6 → b1 (1 free); 0 → b2 (1 free); 5 → b3 (2 free); 2 → b4 (2 free); 3 → b3; 4 → b1; 1 → b2
    assert FirstFitDecreasingPacker(5).pack(LENGTHS) == [[7], [6, 4], [0, 1], [5, 3], [2]]


def test_modified_first_fit_decreasing_by_hand():
    # C=5: large (>2.5) 7,0,6,2,5 open bins; medium (5/3, 2.5]: index 3 joins the first large bin with room (2);
    # small (5/6, 5/3]: 1 and 4 fill the last bin without a medium item (5: 3 + 1 + 1)
    assert get_packer(PackingAlgorithm.MODIFIED_FIRST_FIT_DECREASING, 5).pack(LENGTHS) == [
        [7],
        [0],
        [6],
        [2, 3],
        [5, 1, 4],
    ]
    with pytest.raises(ValueError, match="positive"):
        ModifiedFirstFitDecreasingPacker(5).pack([2, 0, 1])


def test_first_fit_shuffle_uses_pythons_random_order():
    random.seed(3)
    bins = FirstFitShufflePacker(5).pack(LENGTHS)
    random.seed(3)
    order = list(range(len(LENGTHS)))
    random.shuffle(order)
    assert bins == first_fit(order, LENGTHS, 5)
    assert sorted(i for members in bins for i in members) == list(range(len(LENGTHS)))
    assert all(sum(LENGTHS[i] for i in members) <= 5 for members in bins)


def test_bin_count_constraints_move_single_sequences_out_of_the_fullest_bin():
    # FFD in bins of 8: [[7, 5], [6, 0], [2, 3, 4, 1]]; extra bins take the last index of the 4-sequence bin
    assert FirstFitDecreasingPacker(8).pack(LENGTHS) == [[7, 5], [6, 0], [2, 3, 4, 1]]
    assert get_packer("first_fit_decreasing", 8, min_bin_count=5).pack(LENGTHS) == [
        [7, 5],
        [6, 0],
        [2, 3],
        [1],
        [4],
    ]
    assert get_packer("FIRST_FIT_DECREASING", 8, bin_count_multiple=2).pack(LENGTHS) == [
        [7, 5],
        [6, 0],
        [2, 3, 4],
        [1],
    ]
    with pytest.raises(ValueError, match="Cannot create 9 bins with only 8 sequences"):
        get_packer("first_fit_decreasing", 8, min_bin_count=9).pack(LENGTHS)
    with pytest.raises(ValueError, match="bin_count_multiple must be positive"):
        FirstFitDecreasingPacker(8, bin_count_multiple=0)


def test_get_packer_names_and_errors():
    assert {a.value for a in PackingAlgorithm} == {
        "concatenative",
        "first_fit_decreasing",
        "first_fit_shuffle",
        "modified_first_fit_decreasing",
    }
    assert type(get_packer("First_Fit_Shuffle", 4)) is FirstFitShufflePacker
    with pytest.raises(ValueError, match="Unknown packing algorithm: best_fit"):
        get_packer("best_fit", 4)
    for algorithm in PackingAlgorithm:
        with pytest.raises(ValueError, match="Sequence length 5 exceeds bin capacity 4"):
            get_packer(algorithm, 4).pack([1, 5])


# ---------------------------------------------------------------- metrics
def test_packing_metrics_by_hand(capsys):
    metrics = PackingMetrics()
    # lengths [4, 1, 3] in bins of 5 as [[0, 1], [2]]: fills 1.0 and 0.6; 8 of 10 tokens used
    stats = metrics.update([4, 1, 3], [[0, 1], [2]], 5, packing_time=0.5)
    assert stats["total_waste"] == 2 and stats["theoretical_min_bins"] == 2 and stats["bin_efficiency"] == 1.0
    assert stats["average_utilization"] == pytest.approx(0.8) and stats["waste_ratio"] == pytest.approx(0.2)
    # sample stdev of (1.0, 0.6) = 0.2 * sqrt(2); balance = 1 - 0.28284 / 0.8
    assert stats["bin_balance"] == pytest.approx(1 - 0.2 * 2**0.5 / 0.8)
    metrics.update([4, 1, 3, 2], [[0, 1], [2, 3]], 5)
    aggregated = metrics.get_aggregated_stats()
    assert aggregated["total_sequences"] == 7 and aggregated["total_bins"] == 4
    assert aggregated["average_utilization"] == pytest.approx(18 / 20)
    assert (aggregated["min_utilization"], aggregated["max_utilization"]) == pytest.approx((0.8, 1.0))
    assert aggregated["average_waste_ratio"] == pytest.approx(0.1)
    assert aggregated["average_packing_time"] == 0.5 and aggregated["average_bin_count"] == 2
    assert PackingMetrics().calculate_stats_only([], [], 5)["num_bins"] == 0
    packer = get_packer("concatenative", 5, collect_metrics=True)
    packer.pack([4, 1, 3])
    assert packer.get_aggregated_metrics()["total_bins"] == 2
    packer.reset_metrics()
    assert packer.get_aggregated_metrics() == {}
    assert get_packer("concatenative", 5).compute_metrics([4, 1, 3], [[0, 1], [2]])["total_waste"] == 2
    get_packer("concatenative", 5).print_metrics()
    assert "collect_metrics=True" in capsys.readouterr().out


# ---------------------------------------------------------------- processors (a real chat template)
@pytest.fixture(scope="module")
def tokenizer():
    from nemo_rl_clone.models.huggingface import load_tokenizer

    return load_tokenizer("tiny-random-llama")


def _ids(tokenizer, messages, add_generation_prompt=False):
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _joined(message_log):
    return torch.cat([m["token_ids"] for m in message_log]).tolist()


def test_sft_processor_templates_the_conversation(tokenizer):
    from nemo_rl_clone.data.processors import sft_processor

    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    spec = TaskDataSpec("sft", prompt="Q: {}")
    datum = sft_processor({"messages": messages}, spec, tokenizer, 1024, 7)
    expected = _ids(tokenizer, [{"role": "user", "content": "Q: 2+2?"}, messages[1]])
    assert _joined(datum["message_log"]) == expected and datum["length"] == len(expected)
    assert (datum["extra_env_info"], datum["loss_multiplier"], datum["idx"]) == (None, 1.0, 7)
    short = sft_processor({"messages": messages}, spec, tokenizer, 3, 7)
    assert short["loss_multiplier"] == 0.0 and short["length"] <= 3


def test_preference_preprocessor_lower_rank_is_chosen(tokenizer):
    from nemo_rl_clone.data.processors import preference_preprocessor
    from nemo_rl_clone.utils.errors import UserInputError

    row = {
        "context": [{"role": "user", "content": "2+2?"}],
        "completions": [
            {"rank": 1, "completion": [{"role": "assistant", "content": "5"}]},
            {"rank": 0, "completion": [{"role": "assistant", "content": "4"}]},
        ],
    }
    datum = preference_preprocessor(row, TaskDataSpec("pref"), tokenizer, 1024, 3)
    assert "4" in datum["message_log_chosen"][-1]["content"] and "5" in datum["message_log_rejected"][-1]["content"]
    assert datum["length_chosen"] == len(_ids(tokenizer, [*row["context"], {"role": "assistant", "content": "4"}]))
    tie = {**row, "completions": [dict(c, rank=0) for c in row["completions"]]}
    with pytest.raises(UserInputError, match="same rank"):
        preference_preprocessor(tie, TaskDataSpec("pref"), tokenizer, 1024, 3)


def test_math_hf_data_processor_reads_messages_and_ignores_the_system_prompt(tokenizer):
    from nemo_rl_clone.data.processors import math_hf_data_processor

    row = {"messages": [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}], "task_name": "m"}
    datum = math_hf_data_processor(row, TaskDataSpec("m", prompt="P {}", system_prompt="SYS"), tokenizer, 1024, 0)
    assert [m["role"] for m in datum["message_log"]] == ["user"]
    assert _joined(datum["message_log"]) == _ids(tokenizer, [{"role": "user", "content": "P 1+1"}], True)
    assert (datum["extra_env_info"], datum["task_name"]) == ({"ground_truth": "2"}, "m")


def test_multichoice_qa_processor_builds_the_options_prompt(tokenizer):
    from nemo_rl_clone.data.processors import multichoice_qa_processor

    row = {"question": "Which?", "options": {"A": "x", "B": None, "C": "z"}, "answer": "C", "subject": "s"}
    spec = TaskDataSpec("mc")
    spec.prompt = "Answer."  # NeMo-RL's multiple-choice prompt is a prefix, not a "{}" template
    datum = multichoice_qa_processor(row, spec, tokenizer, 1024, 0)
    user = "Answer.\n\nQuestion: Which?\nOptions:\nA) x\nC) z"
    assert _joined(datum["message_log"]) == _ids(tokenizer, [{"role": "user", "content": user}], True)
    assert datum["extra_env_info"] == {"ground_truth": "C", "subject": "s"} and "task_name" not in datum


def test_helpsteer3_data_processor_puts_the_conversation_in_the_first_message(tokenizer):
    from nemo_rl_clone.data.processors import helpsteer3_data_processor

    row = {"context": "hi", "response": [{"role": "assistant", "content": "yo"}], "task_name": "hs3"}
    datum = helpsteer3_data_processor(row, TaskDataSpec("hs3"), tokenizer, 1024, 0)
    expected = _ids(tokenizer, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    first, second = datum["message_log"]
    assert first["token_ids"].tolist() == expected and len(second["token_ids"]) == 0
    assert (datum["length"], datum["extra_env_info"], datum["task_name"]) == (
        len(expected),
        {"ground_truth": "yo"},
        "hs3",
    )


def test_register_processor_and_refused_processors(monkeypatch):
    import nemo_rl_clone.data.nemo_rl_processors as nemo_rl_processors
    import nemo_rl_clone.data.processors as processors

    monkeypatch.setattr(nemo_rl_processors, "PROCESSOR_REGISTRY", dict(nemo_rl_processors.PROCESSOR_REGISTRY))
    assert processors.PROCESSOR_REGISTRY["default"] is processors.math_hf_data_processor
    processors.register_processor("mine", processors.sft_processor)
    assert nemo_rl_processors.PROCESSOR_REGISTRY["mine"] is processors.sft_processor
    with pytest.raises(ValueError, match="already registered"):
        processors.register_processor("mine", processors.sft_processor)
    for name, feature in [("kd_data_processor", "cross-tokenizer"), ("nemo_gym_data_processor", "NeMo-Gym")]:
        with pytest.raises(UnsupportedFeatureError, match=feature):
            getattr(processors, name)
    with pytest.raises(AttributeError):
        processors.no_such_processor  # noqa: B018


# ---------------------------------------------------------------- collate
def _message(role, ids):
    return {"role": role, "content": "", "token_ids": torch.tensor(ids)}


def test_preference_collate_fn_interleaves_pairs_and_masks_the_answer():
    from nemo_rl_clone.data.collate_fn import preference_collate_fn

    pairs = [
        {
            "message_log_chosen": [_message("user", [1, 2]), _message("assistant", [3])],
            "message_log_rejected": [_message("user", [1, 2]), _message("assistant", [4, 5])],
            "loss_multiplier": 1.0,
            "idx": 0,
        },
        {
            "message_log_chosen": [_message("user", [6]), _message("assistant", [7])],
            "message_log_rejected": [_message("user", [6]), _message("assistant", [8])],
            "loss_multiplier": 0.0,
            "idx": 1,
        },
    ]
    batch = preference_collate_fn(pairs, SimpleNamespace(pad_token_id=0), 4, add_loss_mask=True)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 0], [1, 2, 4, 5], [6, 7, 0, 0], [6, 8, 0, 0]]
    assert batch["input_lengths"].tolist() == [3, 4, 2, 2] and batch["sample_mask"].tolist() == [1, 1, 0, 0]
    assert batch["token_mask"].tolist() == [[0, 0, 1, 0], [0, 0, 1, 1], [0, 1, 0, 0], [0, 1, 0, 0]]
    assert "token_mask" not in preference_collate_fn(pairs, SimpleNamespace(pad_token_id=0), 1, add_loss_mask=False)


# ---------------------------------------------------------------- data.utils
def test_get_train_dataset_name_takes_dicts_lists_and_our_config():
    from nemo_rl_clone.data.config import DataConfig
    from nemo_rl_clone.data.utils import get_train_dataset_name

    assert get_train_dataset_name({"train": {"dataset_name": "a"}}) == "a"
    assert get_train_dataset_name({"train": [{"dataset_name": "b"}, {"dataset_name": "c"}]}) == "b"
    assert get_train_dataset_name({"train": []}) is None and get_train_dataset_name(None) is None
    assert get_train_dataset_name(DataConfig(dataset_name="squad")) == "squad"


class _Loader:
    state = None

    def load_state_dict(self, state):
        self.state = state


def test_load_dataloader_state_restores_unless_the_dataset_changed(tmp_path, capsys):
    from nemo_rl_clone.data.utils import load_dataloader_state

    torch.save({"position": 3}, tmp_path / "train_dataloader.pt")  # NeMo-RL's file: the raw state
    torch.save({"dataloader": {"position": 5}, "rng": {}}, tmp_path / "train_dataloader_ours.pt")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"data": {"train": {"dataset_name": "a"}}}))
    loader = _Loader()
    load_dataloader_state(loader, str(tmp_path), {"train": {"dataset_name": "a"}})
    assert loader.state == {"position": 3}
    load_dataloader_state(loader, tmp_path, {"train": {"dataset_name": "a"}}, suffix="_ours")
    assert loader.state == {"position": 5}
    swapped = _Loader()
    load_dataloader_state(swapped, tmp_path, {"train": [{"dataset_name": "b"}]})
    assert swapped.state is None and "Dataset swap detected: was 'a', now 'b'" in capsys.readouterr().out


# ---------------------------------------------------------------- config types and refusals
def test_data_config_types():
    import typing

    from nemo_rl_clone.data import EvalDataConfigType, LocalMathEvalDataConfig, ResponseDatasetConfig

    assert ResponseDatasetConfig.__required_keys__ == frozenset()  # every key optional, as NeMo-RL's
    assert {"dataset_name", "split_validation_size", "seed"} <= ResponseDatasetConfig.__optional_keys__
    assert LocalMathEvalDataConfig.__required_keys__ == {
        "max_input_seq_length",
        "dataset_name",
        "problem_key",
        "solution_key",
        "file_format",
    }
    assert LocalMathEvalDataConfig in typing.get_args(EvalDataConfigType)


@pytest.mark.parametrize(
    ("module", "name", "feature"),
    [
        ("nemo_rl_clone.data", "MMAUEvalDataConfig", "audio"),
        ("nemo_rl_clone.data.dataloader", "MultipleDataloaderWrapper", "use_multiple_dataloader"),
        ("nemo_rl_clone.data.llm_message_utils", "decompose_message_log", "data plane"),
        ("nemo_rl_clone.data.llm_message_utils", "MESSAGE_LOG_BULK_FIELDS", "data plane"),
    ],
)
def test_names_of_unbuilt_features_are_refused_in_one_line(module, name, feature):
    import importlib

    with pytest.raises(UnsupportedFeatureError, match=feature) as caught:
        getattr(importlib.import_module(module), name)
    assert "\n" not in str(caught.value)


# ---------------------------------------------------------------- collectives (two gloo ranks)
def _collectives_rank(rank: int, store_path: str) -> None:
    import torch.distributed as dist

    from nemo_rl_clone.distributed.collectives import gather_jagged_object_lists, rebalance_nd_tensor

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    try:
        # rank 0 holds 3 rows, rank 1 one row: every rank gets the 4 rows in rank order
        rows = torch.arange(6, dtype=torch.float32).reshape(3, 2) if rank == 0 else torch.full((1, 2), -1.0)
        expected = [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [-1.0, -1.0]]
        assert rebalance_nd_tensor(rows).tolist() == expected
        objects = ["a", "b"] if rank == 0 else [{"c": 1}]
        assert gather_jagged_object_lists(objects) == ["a", "b", {"c": 1}]
    finally:
        dist.destroy_process_group()


def test_collectives_concatenate_ragged_ranks_in_rank_order(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_collectives_rank, args=(str(tmp_path / "store"),), nprocs=2, join=True)
