"""NeMo-RL v0.7.0's GRPO script API, the pure parts (the whole script runs in
tests/functional/test_nemo_rl_entry_scripts.py): ``MasterConfig(**config)`` with dict sections validated once,
``setup``'s refusals, the run ``grpo_train`` / ``async_grpo_train`` form from NeMo-RL's arguments,
``setup_response_data`` without environments and ``configure_generation_config``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from nemo_rl_clone.algorithms.grpo import MasterConfig, async_grpo_train, setup
from nemo_rl_clone.algorithms.run.nemo_rl_parts import run_from_parts
from nemo_rl_clone.data.utils import setup_response_data
from nemo_rl_clone.models.generation import configure_generation_config
from nemo_rl_clone.models.generation.config import GenerationConfig
from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer
from nemo_rl_clone.utils.config import load_config
from nemo_rl_clone.utils.config_validation import ConfigError, as_config
from nemo_rl_clone.utils.errors import UserInputError

REPO = Path(__file__).resolve().parents[2]
GSM8K_MINI = REPO / "tests" / "data" / "gsm8k_format_mini.jsonl"


def nemo_rl_master_config(tmp_path: Path) -> MasterConfig:
    """The smoke recipe as NeMo-RL's script builds it: ``MasterConfig(**plain dict)``, every section still a dict."""
    config = OmegaConf.to_container(load_config(REPO / "configs" / "grpo_smoke.yaml"), resolve=True)
    assert isinstance(config, dict)
    config["logger"]["log_dir"] = tmp_path / "logs" / "exp_1"  # a pathlib.Path, as get_next_experiment_dir gives
    return MasterConfig(**config)


def test_master_config_of_dict_sections_is_validated_once_with_the_scripts_edits(tmp_path):
    config = nemo_rl_master_config(tmp_path)
    assert isinstance(config.policy, dict) and isinstance(config.grpo["async_grpo"], dict)
    config.policy["generation"]["max_new_tokens"] = 12  # the script edits the sections as dicts
    validated = as_config(config, MasterConfig)
    assert validated is not config and isinstance(validated.policy.generation, GenerationConfig)
    assert validated.policy.generation.max_new_tokens == 12
    assert validated.logger.log_dir == str(tmp_path / "logs" / "exp_1")
    assert as_config(validated, MasterConfig) is validated  # typed: not validated again
    # NeMo-RL's run_grpo.py reads the returned master config's data_plane as a dict
    assert validated.data_plane.get("enabled", True) is False and validated.data_plane["enabled"] is False
    assert "impl" in validated.data_plane and validated.data_plane.get("observability", {}) == {}
    with pytest.raises(KeyError):
        validated.data_plane["observability"]


def test_a_typo_in_a_dict_section_is_one_line_naming_the_key(tmp_path):
    config = nemo_rl_master_config(tmp_path)
    config.grpo["num_prompts_per_stepp"] = 4
    with pytest.raises(ConfigError) as raised:
        as_config(config, MasterConfig)
    (problem,) = raised.value.problems
    assert problem.startswith("grpo.num_prompts_per_stepp: unknown key"), problem


def test_setup_refuses_what_is_not_built_before_starting_anything(tmp_path):
    config = nemo_rl_master_config(tmp_path)
    cases = [
        ({"dataset": {"math": []}}, "dataset: not supported yet"),
        ({"dataset": [], "processor": object()}, "processor: not supported yet"),
        ({"dataset": None}, "dataset: required"),
    ]
    for kwargs, message in cases:
        with pytest.raises(UserInputError, match=message):
            setup(config, object(), **kwargs)


def parts(tmp_path: Path, **grpo: object) -> dict[str, object]:
    config = nemo_rl_master_config(tmp_path)
    config.grpo.update(grpo)
    return {
        "master_config": as_config(config, MasterConfig),
        "tokenizer": "tok",
        "models": ("policy", "generation", "loss"),
        "loaders": ("loader", SimpleNamespace(dataset=["v1", "v2"])),
        "envs": ({"math": "train-env"}, {"math": "val-env", "other": "val-only"}),
        "records": (SimpleNamespace(log_dir=tmp_path), "checkpointer", "state"),
    }


def test_train_arguments_form_the_run(tmp_path):
    run = run_from_parts(*parts(tmp_path).values())
    assert (run.policy, run.generation, run.loss_fn, run.dataloader) == ("policy", "generation", "loss", "loader")
    assert run.val_dataset == ["v1", "v2"]  # the validation loader's prompts
    assert run.task_to_env == {"math": "train-env", "other": "val-only"}  # the training environment wins a name
    assert (run.checkpointer, run.state, run.log_dir, run.clusters) == ("checkpointer", "state", tmp_path, [])
    assert run.colocated is True and run.tokenizer == "tok"


def test_async_grpo_train_needs_async_engines_and_no_teachers(tmp_path):
    given = parts(tmp_path)
    policy, generation, loss = given["models"]
    loader, val_loader = given["loaders"]
    (task_to_env, val_task_to_env), (logger, checkpointer, state) = given["envs"], given["records"]
    arguments = (policy, generation, loader, val_loader, "tok", loss, task_to_env, val_task_to_env, logger)
    with pytest.raises(UserInputError, match=r"^grpo\.async_grpo\.enabled: must be true"):
        async_grpo_train(*arguments, checkpointer, state, given["master_config"])
    with pytest.raises(UserInputError, match=r"^teacher_worker_groups: not supported yet"):
        async_grpo_train(*arguments, checkpointer, state, given["master_config"], teacher_worker_groups={"t": 1})


def test_setup_response_data_without_environments_gives_the_two_datasets():
    data = {
        "max_input_seq_length": 64,
        "train": {"dataset_name": "gsm8k", "data_path": str(GSM8K_MINI)},
        "validation": {"dataset_name": "gsm8k", "data_path": str(GSM8K_MINI)},
        "default": {"prompt_file": None, "env_name": "math"},
    }
    dataset, val_dataset = setup_response_data(load_tokenizer(TINY_LLAMA), data)
    assert len(dataset) == len(val_dataset) == 8
    assert data["train"] == {"dataset_name": "gsm8k", "data_path": str(GSM8K_MINI)}  # not turned into a list
    with pytest.raises(UserInputError, match=r"^is_vlm: not supported yet"):
        setup_response_data(load_tokenizer(TINY_LLAMA), data, is_vlm=True)
    with pytest.raises(ConfigError, match=r"data\.max_input_seq_lenght: unknown key"):
        setup_response_data(None, {**data, "max_input_seq_lenght": 1})


def test_configure_generation_config_stops_at_eos_and_keeps_a_valid_section():
    tokenizer = SimpleNamespace(eos_token_id=7, pad_token_id=0)
    section = {"backend": "vllm", "stop_token_ids": None, "vllm_cfg": {}}
    assert configure_generation_config(section, tokenizer, has_refit_draft_weights=False, trains_mtp=False) is section
    assert section == {"backend": "vllm", "stop_token_ids": [7], "vllm_cfg": {}}
    chosen = {"stop_token_ids": [3]}
    assert configure_generation_config(chosen, tokenizer)["stop_token_ids"] == [3]
    typed = configure_generation_config(GenerationConfig(), tokenizer)
    assert typed.stop_token_ids == [7]
