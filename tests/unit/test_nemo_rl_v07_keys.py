"""NeMo-RL v0.7.0's algorithm-side config keys: the ones implemented do what they say (advantage estimator switches
and clipping, the per-sequence logprob-error mask, validation at the end, max_num_steps -1, the nested ``data``
layout, SFT's add_bos / add_eos), and the ones refused fail validation with one line naming the key."""

from __future__ import annotations

import math
import sys

import datasets
import pytest
import torch

from nemo_rl_clone.algorithms.dpo import DPOMasterConfig
from nemo_rl_clone.algorithms.grpo.advantages import mask_logprob_mismatch, step_advantages
from nemo_rl_clone.algorithms.grpo.config import GRPOConfig, GRPOMasterConfig
from nemo_rl_clone.algorithms.rm import RMMasterConfig
from nemo_rl_clone.algorithms.run.rollout import _validation_rows
from nemo_rl_clone.algorithms.sft import SFTMasterConfig
from nemo_rl_clone.data.config import DataConfig, SFTDataConfig
from nemo_rl_clone.data.supervised import build_sft_datum
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.models.huggingface import load_tokenizer
from nemo_rl_clone.utils.config_validation import ConfigError, validate_config

LONG_POLICY = {"policy": {"max_total_sequence_length": 1024}}


def problems(config: dict, schema: type) -> list[str]:
    try:
        validate_config(config, schema)
    except ConfigError as error:
        return error.problems
    return []


# ------------------------------------------------------------------------------------------------ GRPO advantages

REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0, 3.0, 1.0])  # two groups of 3


def test_adv_estimator_switches_override_the_flat_keys():
    flat = GRPOConfig(num_generations_per_prompt=3, normalize_rewards=True, use_leave_one_out_baseline=True)
    nested = validate_config(
        {
            "num_generations_per_prompt": 3,
            "adv_estimator": {"name": "grpo", "normalize_rewards": False, "use_leave_one_out_baseline": False},
        },
        GRPOConfig,
    )
    # group means 1/3 and 4/3; no std division
    expected = torch.tensor([2 / 3, -1 / 3, -1 / 3, -4 / 3, 5 / 3, -1 / 3])
    torch.testing.assert_close(step_advantages(REWARDS, nested), expected)
    assert not torch.allclose(step_advantages(REWARDS, flat), expected)
    unset = validate_config({"num_generations_per_prompt": 3, "adv_estimator": {"name": "grpo"}}, GRPOConfig)
    torch.testing.assert_close(step_advantages(REWARDS, unset), step_advantages(REWARDS, flat))


def test_advantage_clipping():
    cfg = validate_config(
        {
            "num_generations_per_prompt": 3,
            "normalize_rewards": False,
            "use_leave_one_out_baseline": False,
            "advantage_clip_low": -1.0,
            "advantage_clip_high": 0.5,
        },
        GRPOConfig,
    )
    expected = torch.tensor([0.5, -1 / 3, -1 / 3, -1.0, 0.5, -1 / 3])
    torch.testing.assert_close(step_advantages(REWARDS, cfg), expected)
    one_sided = GRPOConfig(
        num_generations_per_prompt=3, normalize_rewards=False, use_leave_one_out_baseline=False, advantage_clip_low=0.0
    )
    torch.testing.assert_close(step_advantages(REWARDS, one_sided), torch.tensor([2 / 3, 0, 0, 0, 5 / 3, 0]))


@pytest.mark.parametrize(
    ("config", "line"),
    [
        (
            {"grpo": {"adv_estimator": {"name": "gdpo"}}},
            "grpo.adv_estimator.name: 'gdpo' needs several reward components per sample, which env.math does not "
            "return (env.math_multi_reward does); use 'grpo'",
        ),
        (
            {"grpo": {"advantage_clip_low": 1.0, "advantage_clip_high": -1.0}},
            "grpo.advantage_clip_low: must be <= advantage_clip_high (1.0 > -1.0)",
        ),
        (
            {"grpo": {"seq_logprob_error_threshold": 0.5}},
            "grpo.seq_logprob_error_threshold: must be >= 1 (1 is exact agreement), got 0.5",
        ),
        (
            {"env": {"math": {}, "dapo": {"num_workers": 16}}},
            "env.dapo: not supported yet: a separate DAPO environment; DAPO's scoring is env.math with "
            "math_verify_impl: dapo_math_verify (data.default.env_name: math)",
        ),
        (
            {"env": {"math": {}, "should_use_nemo_gym": True}},
            "env.should_use_nemo_gym: not supported yet: NeMo-Gym environments (the nemo-gym package needs Python "
            f">= 3.12{'; this is Python 3.11' if sys.version_info < (3, 12) else ''}). An agent that talks to the "
            "run's OpenAI-compatible server trains with env.agent (docs/agents.md)",
        ),
    ],
)
def test_grpo_refusals_are_one_line_each(config, line):
    assert problems(config, GRPOMasterConfig) == [line]


def test_nemo_rl_no_op_values_validate():
    config = {
        "grpo": {
            "val_at_end": False,
            "adv_estimator": {
                "name": "grpo",
                "minus_baseline": True,
                "normalize_rewards": True,
                "use_leave_one_out_baseline": True,
            },
            "advantage_clip_low": None,
            "advantage_clip_high": None,
            "invalid_tool_call_advantage": None,
            "malformed_thinking_advantage": None,
            "seq_logprob_error_threshold": None,
            "reward_shaping": {"stop_properly_penalty_coef": None},
        },
        "data_plane": {"enabled": False, "impl": "transfer_queue", "backend": "simple", "num_storage_units": 2},
        "on_policy_distillation": None,
    }
    assert problems(config, GRPOMasterConfig) == []


# ------------------------------------------------------------------------------ per-sequence logprob error mask


def test_mask_logprob_mismatch_masks_sequences_over_the_threshold():
    # [B, S] policy layout: position 0 holds nothing; tokens 1..3 trainable where token_mask says so
    gaps = [[0.0, 0.1, -0.1, 0.0], [0.0, 1.0, 1.0, 0.0], [0.0, 2.0, 0.0, 0.0]]
    token_mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0], [0, 0, 1, 1]], dtype=torch.float32)
    prev = torch.full((3, 4), -1.0)
    data = BatchedDataDict(
        token_mask=token_mask,
        sample_mask=torch.tensor([1.0, 1.0, 0.0]),
        prev_logprobs=prev,
        generation_logprobs=prev + torch.tensor(gaps),
    )
    # per-sequence mean exp|gap| over trainable tokens: (e^.1 + e^.1 + 1)/3 ≈ 1.07; e^1 ≈ 2.72; (1 + 1)/2 = 1
    # (sequence 2's gap of 2 sits on a masked token, and it is masked already)
    masked = mask_logprob_mismatch(data, threshold=2.0)
    assert masked == 1
    torch.testing.assert_close(data["sample_mask"], torch.tensor([1.0, 0.0, 0.0]))
    assert mask_logprob_mismatch(data, threshold=(2 * math.exp(0.1) + 1) / 3 - 1e-4) == 1
    torch.testing.assert_close(data["sample_mask"], torch.tensor([0.0, 0.0, 0.0]))


# ------------------------------------------------------------------------------------ validation at the end, -1s


def test_rm_minus_one_means_no_limit():
    rm_policy = {"policy": {"max_total_sequence_length": 1024, "reward_model_cfg": {"enabled": True}}}
    config = validate_config(
        {"rm": {"max_num_steps": -1, "val_batches": -1, "val_at_end": True}, **rm_policy}, RMMasterConfig
    )
    assert config.rm.step_limit == math.inf and config.rm.val_at_end
    assert problems({"rm": {"max_num_steps": 0}, **rm_policy}, RMMasterConfig) == [
        "rm.max_num_steps: must be >= 1, or -1 for no limit, got 0"
    ]
    dpo = validate_config({"dpo": {"val_at_end": True, "max_num_steps": 7}, **LONG_POLICY}, DPOMasterConfig)
    assert dpo.dpo.step_limit == 7 and dpo.dpo.val_at_end


# ---------------------------------------------------------------------------------------- nested data layout


def test_grpo_nested_data_layout_maps_onto_the_flat_keys():
    data = validate_config(
        {
            "train": {"dataset_name": "DAPOMath17K", "split_validation_size": 0.05, "seed": 7},
            "validation": None,
            "default": {
                "env_name": "math",
                "processor": "math_hf_data_processor",
                "prompt_file": None,
                "system_prompt_file": "examples/prompts/cot.txt",
            },
            "use_multiple_dataloader": False,
        },
        DataConfig,
    )
    assert (data.dataset_name, data.split_validation_size, data.env_name) == ("DAPOMath17K", 0.05, "math")
    assert (data.prompt_file, data.system_prompt_file) == (None, "examples/prompts/cot.txt")
    assert data.split_seed(42) == 7 and DataConfig().split_seed(42) == 42
    flat = validate_config({"dataset_name": "DeepScaler", "prompt_file": None}, DataConfig)
    assert (flat.dataset_name, flat.prompt_file) == ("DeepScaler", None)


def test_sft_nested_layout_and_its_refusals():
    data = validate_config(
        {
            "add_bos": True,
            "add_eos": True,
            "add_generation_prompt": False,
            "train": {"dataset_name": "squad", "split": "train"},
            "validation": {"dataset_name": "squad", "split": "validation"},
            "default": {"prompt_file": None, "system_prompt_file": None, "processor": "sft_processor"},
        },
        SFTDataConfig,
    )
    assert (data.dataset_name, data.split, data.add_bos, data.add_eos) == ("squad", None, True, True)
    lines = problems(
        {
            "data": {
                "train": {"dataset_name": "squad", "split": "train_1M"},
                "validation": {"dataset_name": "HelpSteer3", "repeat": 2},
                "default": {"env_name": "math"},
            },
            **LONG_POLICY,
        },
        DPOMasterConfig,
    )
    assert lines == [
        "data.train.split: not supported yet: 'train_1M'; set 'train' or null",
        "data.validation.dataset_name: not supported yet: validation rows come from the training dataset "
        "('squad') or validation.data_path; set it to null or the training dataset",
        "data.validation.repeat: only GRPO repeats validation prompts; set it to 1",
        "data.default.env_name: only GRPO runs score rows with an environment; set it to null",
    ]


def test_dataset_names_not_shipped_validate_but_typos_do_not():
    assert problems({"data": {"train": {"dataset_name": "OpenMathReasoning"}}}, GRPOMasterConfig) == []
    assert problems({"data": {"train": {"dataset_name": "DeepScaleR"}}}, GRPOMasterConfig)[0].startswith(
        "data.dataset_name: unknown dataset 'DeepScaleR' (did you mean 'DeepScaler'?)"
    )
    assert problems({"data": {"dataset_name": "HelpSteer3"}, **LONG_POLICY}, SFTMasterConfig) == []


def test_grpo_validation_rows_repeat_and_come_from_another_dataset(tmp_path):
    own = datasets.Dataset.from_list([{"problem": "p0"}, {"problem": "p1"}])
    repeated = _validation_rows(validate_config({"validation": {"repeat": 3}}, DataConfig), own, seed=0)
    assert [row["problem"] for row in repeated] == ["p0", "p1"] * 3
    assert _validation_rows(DataConfig(), own, seed=0) is own
    local = tmp_path / "aime.jsonl"
    local.write_text('{"id": 0, "problem": "q", "solution": "", "answer": "1", "url": "", "year": "2024"}\n')
    # another dataset's validation rows (aime2024, read from a local file in its hub format), each twice
    data = validate_config(
        {"validation": {"dataset_name": "aime2024", "data_path": str(local), "repeat": 2}}, DataConfig
    )
    assert data.val_data_path is None  # the path belongs to the validation dataset, not the training one
    same_dataset = {"dataset_name": "local", "validation": {"dataset_name": "local", "data_path": "v.jsonl"}}
    assert validate_config(same_dataset, DataConfig).val_data_path == "v.jsonl"
    rows = _validation_rows(data, own, seed=0)
    assert len(rows) == 2 and rows[0] == rows[1] and rows[0]["problem"] == "q"


# ----------------------------------------------------------------------------------------------- SFT add_bos/eos


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-random-llama")


def test_add_bos_and_add_eos_add_the_token_only_where_missing(tokenizer):
    messages = [{"role": "user", "content": "2 + 3?"}, {"role": "assistant", "content": "5"}]
    plain = build_sft_datum(messages, tokenizer, 512, 0)
    both = build_sft_datum(messages, tokenizer, 512, 0, add_bos=True, add_eos=True)
    ids = [m["token_ids"].tolist() for m in plain["message_log"]]
    new = [m["token_ids"].tolist() for m in both["message_log"]]
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    expected_first = ids[0] if ids[0][:1] == [bos] else [bos, *ids[0]]
    # The template closes a turn with EOS and a newline: the token counts as there (NeMo-RL strips the newline first).
    newline = tokenizer.convert_tokens_to_ids(tokenizer.tokenize("\n"))
    closed = ids[-1][-1:] == [eos] or ids[-1][-1 - len(newline) :] == [eos, *newline]
    expected_last = ids[-1] if closed else [*ids[-1], eos]
    assert new[0] == expected_first and new[-1] == expected_last
    assert both["length"] == len(expected_first) + len(expected_last)
    assert tokenizer.convert_ids_to_tokens(eos) in both["message_log"][-1]["content"]
    # applied twice, nothing more is added
    again = build_sft_datum(messages, tokenizer, 512, 0, add_bos=True, add_eos=True)
    assert again["length"] == both["length"]


def test_add_generation_prompt_moves_the_assistant_header_out_of_the_trained_tokens(tokenizer):
    """NeMo-RL's SFT ``data.add_generation_prompt: true``: the header before each reply ends the user message."""
    messages = [
        {"role": "user", "content": "2 + 3?"},
        {"role": "assistant", "content": "5"},
        {"role": "user", "content": "and 4 + 4?"},
        {"role": "assistant", "content": "8"},
    ]
    plain = build_sft_datum(messages, tokenizer, 512, 0)["message_log"]
    header = build_sft_datum(messages, tokenizer, 512, 0, add_generation_prompt=True)["message_log"]
    # The same tokens in all: only the message boundaries moved.
    assert torch.cat([m["token_ids"] for m in plain]).tolist() == torch.cat([m["token_ids"] for m in header]).tolist()
    prompt = tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    bare = tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=False)
    assistant_header = prompt[len(bare) :]
    assert assistant_header  # the template has one
    for turn in (0, 2):
        assert header[turn]["content"] == plain[turn]["content"] + assistant_header
        assert plain[turn + 1]["content"] == assistant_header + header[turn + 1]["content"]
        assert header[turn + 1]["content"].startswith(messages[turn + 1]["content"])
    trained = sum(int(m["token_loss_mask"].sum()) for m in header)
    assert trained < sum(int(m["token_loss_mask"].sum()) for m in plain)
