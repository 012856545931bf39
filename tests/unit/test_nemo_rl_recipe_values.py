"""Values of NeMo-RL v0.7.0's recipes that carry NeMo-RL's meaning here (docs/porting.md#configs), each checked
for what it does, and the keys of features not built here: accepted at their "off" value, refused otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
from nemo_rl_clone.algorithms.run.rollout import setup_data
from nemo_rl_clone.evals.config import EvalDataConfig
from nemo_rl_clone.models.generation.config import GenerationConfig
from nemo_rl_clone.models.generation.vllm import engine_io
from nemo_rl_clone.models.huggingface import load_tokenizer
from nemo_rl_clone.utils.config import load_config, load_validated_config
from nemo_rl_clone.utils.config_validation import ConfigError, validate_config

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "configs" / "grpo_smoke.yaml"


def grpo(*overrides: str) -> GRPOMasterConfig:
    return load_validated_config(SMOKE, list(overrides), GRPOMasterConfig)


def problems(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as err:
        grpo(*overrides)
    return err.value.problems


def write_math_rows(path: Path, count: int) -> Path:
    rows = ({"problem": f"{i} + 1?", "expected_answer": str(i + 1)} for i in range(count))  # OpenMathInstruct-2's
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_batch_multiplier_widens_each_generation_batch_under_dynamic_sampling(tmp_path):
    rows = write_math_rows(tmp_path / "rows.jsonl", 20)
    data = [
        "data.dataset_name=OpenMathInstruct-2",
        f"++data.data_path={rows}",
        "~data.reasoning_gym",
        "++env.math={num_workers: 1}",
        "data.prompt_file=null",
        "grpo.num_prompts_per_step=4",
    ]
    config = grpo(*data, "grpo.use_dynamic_sampling=true", "grpo.batch_multiplier=1.5")
    assert config.grpo.prompts_per_generation_batch == 6  # int(4 * 1.5)
    loader, _ = setup_data(config, load_tokenizer(config.policy.tokenizer.name))
    assert loader.batch_size == 6 and next(iter(loader)).size == 6
    # NeMo-RL asserts it is 1 without dynamic sampling; below 1 would draw fewer prompts than a step trains on.
    assert problems(*data, "grpo.batch_multiplier=2") == [
        "grpo.batch_multiplier: only applies with use_dynamic_sampling; set it to 1 (got 2.0)"
    ]
    assert problems(*data, "grpo.use_dynamic_sampling=true", "grpo.batch_multiplier=0.5") == [
        "grpo.batch_multiplier: must be >= 1 (got 0.5)"
    ]


def test_periods_and_sizes_that_mean_none_or_all():
    config = grpo("grpo.val_period=-1", "grpo.max_val_samples=null", "grpo.val_batch_size=null")
    assert config.grpo.val_period == -1 and config.grpo.max_val_samples is None
    assert grpo("checkpointing.model_save_format=null").checkpointing.model_save_format is None
    assert problems("checkpointing.model_save_format=null", "checkpointing.save_consolidated=true") == [
        "checkpointing.model_save_format: null writes no consolidated folder; pick one of ['safetensors', 'torch_save']"
    ]


def test_keys_of_unbuilt_features_are_accepted_off_and_refused_on():
    assert grpo("++policy.generation.vllm_cfg.skip_tokenizer_init=false")  # NeMo-RL's default: what happens here
    assert problems("++policy.generation.vllm_cfg.skip_tokenizer_init=true") == [
        "policy.generation.vllm_cfg.skip_tokenizer_init: not supported yet: engines without a tokenizer (NeMo-RL's "
        "key, set to True)"
    ]
    assert problems("++grpo.penalize_malformed_thinking=true") == [
        "grpo.penalize_malformed_thinking: not supported yet: penalising malformed thinking flagged by NeMo-Gym "
        "environments (NeMo-RL's key, set to True)"
    ]
    assert grpo("++grpo.num_val_generations_per_prompt=4").grpo.num_val_generations_per_prompt == 4  # built
    assert problems("++grpo.num_val_generation_per_prompt=1")[0].startswith(
        "grpo.num_val_generation_per_prompt: unknown key"  # a typo stays unknown
    )
    assert grpo("++data_plane=null").data_plane.enabled is False  # a null section is the default


def test_max_num_seqs_reaches_the_engine():
    config = validate_config({"vllm_cfg": {"max_num_seqs": 7}}, GenerationConfig)
    assert engine_io.engine_kwargs(config, "/m", 0, on_gpu=False)["max_num_seqs"] == 7
    assert "max_num_seqs" not in engine_io.engine_kwargs(GenerationConfig(), "/m", 0, on_gpu=False)


def test_an_override_section_replaces_the_inherited_one(tmp_path):
    (tmp_path / "base.yaml").write_text("data:\n  train: {dataset_name: a, seed: 1}\n  shuffle: true\n")
    (tmp_path / "child.yaml").write_text(
        "defaults: base.yaml\ndata:\n  _override_: true\n  train:\n    - {dataset_name: b}\n"
    )
    merged = load_config(tmp_path / "child.yaml")
    assert dict(merged.data) == {"train": [{"dataset_name": "b"}]}  # no shuffle, no merge of a list over a mapping
    (tmp_path / "clash.yaml").write_text("defaults: base.yaml\ndata:\n  train:\n    - {dataset_name: b}\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "clash.yaml")
    assert err.value.problems == [
        f"{tmp_path / 'clash.yaml'}: data.train: cannot merge over its defaults (a list over a mapping or the "
        "reverse); mark the section `_override_: true` to replace it"
    ]


def test_an_evaluation_file_named_by_path(tmp_path):
    rows = tmp_path / "rows.data"
    rows.write_text("Question,Answer\n1 + 1?,2\n")
    data = validate_config(
        {"dataset_name": str(tmp_path / "math.csv"), "problem_key": "Question", "solution_key": "Answer",
         "split": "train", "file_format": "csv"},
        EvalDataConfig,
    )  # fmt: skip
    assert (data.dataset_name, data.data_path) == ("local", str(tmp_path / "math.csv"))
    from nemo_rl_clone.data.datasets.local_math import load_local_math

    named = validate_config({"dataset_name": "local", "data_path": str(rows), "file_format": "csv"}, EvalDataConfig)
    assert named.file_format == "csv"  # the format names the reader, whatever the extension
    loaded = load_local_math(str(rows), "Question", "Answer", file_format="csv")  # the format, not the extension
    assert loaded.validation is not None and loaded.validation[0]["expected_answer"] == "2"
