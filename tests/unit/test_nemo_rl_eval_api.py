"""NeMo-RL v0.7.0's evaluation names as its ``examples/run_eval.py`` calls them: ``load_eval_dataset`` and
``_is_multimodal_dataset`` (``data.datasets.eval_datasets``), ``create_env(env_name=, env_config=)`` with a dict,
``evals.eval.setup`` / ``run_env_eval`` / ``MasterConfig``. Pure: the engines, the environment actor and the
rollout are stand-ins (the whole script runs in tests/functional/test_nemo_rl_entry_scripts.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from nemo_rl_clone.data.datasets import AllTaskProcessedDataset, load_eval_dataset
from nemo_rl_clone.data.datasets.eval_datasets import MULTIMODAL_DATASETS, _is_multimodal_dataset
from nemo_rl_clone.data.processors import math_data_processor
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.environments.utils import create_env
from nemo_rl_clone.evals import nemo_rl_api
from nemo_rl_clone.evals.config import EvalMasterConfig
from nemo_rl_clone.evals.eval import MasterConfig, run_env_eval, setup
from nemo_rl_clone.utils.config_validation import ConfigError
from nemo_rl_clone.utils.errors import UserInputError


def problems_file(path: Path, rows: int = 3) -> Path:
    path.write_text(
        "".join(json.dumps({"Question": f"What is {i} + 1?", "Answer": str(i + 1)}) + "\n" for i in range(rows))
    )
    return path


def nemo_rl_eval_config(data_file: Path, **eval_keys: Any) -> dict[str, Any]:
    """NeMo-RL's ``evals/eval.yaml`` as its script hands it to ``MasterConfig(**config)``, on a local file."""
    return {
        "eval": {
            "metric": "pass@k",
            "num_tests_per_prompt": 1,
            "seed": 42,
            "k_value": 1,
            "save_path": None,
            **eval_keys,
        },
        "generation": {
            "backend": "vllm",
            "max_new_tokens": 16,
            "temperature": 1.0 if eval_keys.get("num_tests_per_prompt", 1) > 1 else 0.0,
            "top_p": 1.0,
            "top_k": -1,
            "num_prompts_per_step": -1,
            "model_name": "tiny-random-llama",
            "stop_token_ids": None,
            "stop_strings": None,
            "vllm_cfg": {"async_engine": False, "precision": "float32", "max_model_len": 64},
            "colocated": {"enabled": True, "resources": {"gpus_per_node": None, "num_nodes": None}},
        },
        "tokenizer": {"name": "tiny-random-llama", "chat_template": "default", "chat_template_kwargs": None},
        "data": {
            "max_input_seq_length": 64,
            "prompt_file": None,
            "system_prompt_file": None,
            "dataset_name": str(data_file),
            "problem_key": "Question",
            "solution_key": "Answer",
            "file_format": "json",
        },
        "env": {"math": {"num_workers": 1}},
        "cluster": {"gpus_per_node": 1, "num_nodes": 1},
    }


# ---------------------------------------------------------------------------------------------------------- datasets
@pytest.mark.parametrize("as_path", [False, True])
def test_load_eval_dataset_reads_a_file_named_by_dataset_name(tmp_path, as_path):
    data = problems_file(tmp_path / "sums.jsonl")
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Solve: {}")
    config = {"dataset_name": data if as_path else str(data), "problem_key": "Question", "solution_key": "Answer"}
    config.update(prompt_file=str(prompt), system_prompt_file=None, file_format="json", split="train")
    loaded = load_eval_dataset(config)
    assert [(row["problem"], row["expected_answer"]) for row in loaded.rekeyed_ds] == [
        (f"What is {i} + 1?", str(i + 1)) for i in range(3)
    ]
    assert loaded.task_spec.prompt_file == str(prompt)
    assert loaded.processor is math_data_processor
    assert getattr(loaded, "preprocessor", None) is None


def test_load_eval_dataset_rows_become_nemo_rl_prompts(tmp_path):
    """As run_eval.py's setup_data builds them: one processor for every row, the set's spec."""
    from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer

    loaded = load_eval_dataset(
        {
            "dataset_name": str(problems_file(tmp_path / "p.jsonl")),
            "problem_key": "Question",
            "solution_key": "Answer",
            "prompt_file": None,
            "system_prompt_file": None,
        }
    )
    dataset = AllTaskProcessedDataset(
        dataset=loaded.rekeyed_ds,
        tokenizer=load_tokenizer(TINY_LLAMA),
        default_task_data_spec=loaded.task_spec,
        task_data_processors=loaded.processor,
        task_data_preprocessors=getattr(loaded, "preprocessor", None),
        max_seq_length=64,
    )
    datum = dataset[2]
    assert datum["extra_env_info"] == {"ground_truth": "3"}
    assert "What is 2 + 1?" in datum["message_log"][-1]["content"]


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"dataset_name": "mmau"}, "data.dataset_name: not supported yet: 'mmau'"),
        ({"dataset_name": "aime2026"}, "data.dataset_name: not supported yet: NeMo-RL's 'aime2026'"),
        ({"dataset_name": "aime2042"}, "data.dataset_name: unknown dataset 'aime2042' (did you mean 'aime2024'?)"),
        ({"dataset_name": "x.csv", "split": "test"}, "data.split: not supported yet: 'test'"),
        ({}, "data.dataset_name: required"),
    ],
)
def test_load_eval_dataset_refuses_in_one_line_naming_the_key(config, says):
    with pytest.raises(UserInputError) as error:
        load_eval_dataset(config)
    assert str(error.value).startswith(says) and "\n" not in str(error.value)


def test_multimodal_datasets_are_nemo_rl_s():
    assert {"mmau", "TwinkStart/MMAU"} == MULTIMODAL_DATASETS
    assert _is_multimodal_dataset("TwinkStart/MMAU") and not _is_multimodal_dataset("aime2024")


# ------------------------------------------------------------------------------------------------------ environment
def test_create_env_validates_nemo_rl_s_dict_before_starting_anything():
    with pytest.raises(ConfigError, match=r"env.math.num_workerz: unknown key \(did you mean env.math.num_workers\?\)"):
        create_env(env_name="math", env_config={"num_workerz": 1})


# ----------------------------------------------------------------------------------------------------- setup and run
class FakeEngines:
    def __init__(self) -> None:
        self.shut_down = False

    def shutdown(self) -> bool:
        self.shut_down = True
        return True


@pytest.fixture
def no_engines(monkeypatch):
    """setup's engines and model stand-ins; returns what was started."""
    started: dict[str, Any] = {"cluster": SimpleNamespace(shutdown=lambda: started.update(cluster_down=True))}
    model = SimpleNamespace(model_path="tiny-random-llama", cleanup=lambda: started.update(model_cleaned=True))
    monkeypatch.setattr("nemo_rl_clone.evals.checkpoint.resolve_eval_model", lambda name: model)
    monkeypatch.setattr(nemo_rl_api, "start_engines", lambda config, path: (started["cluster"], FakeEngines()))
    monkeypatch.setattr("ray.kill", lambda actor: started.update(env_killed=actor))
    return started


def fake_rollouts(monkeypatch, rewards: list[float], answers: list[str | None]) -> None:
    """Each batch's samples get the next rewards and extracted answers, in order."""
    position = [0]

    def roll_out(config, prompts, tokenizer, generation, task_to_env):
        n = config.eval.num_tests_per_prompt
        count = len(prompts["idx"]) * n
        start, position[0] = position[0], position[0] + count
        message_logs = [
            [
                {"role": "user", "content": "q", "token_ids": torch.tensor([1])},
                {"role": "assistant", "content": "a", "token_ids": torch.tensor([2, 3])},
            ]
            for _ in range(count)
        ]
        return BatchedDataDict(
            message_log=message_logs,
            total_reward=torch.tensor(rewards[start : start + count]),
            idx=[i for i in prompts["idx"] for _ in range(n)],
            extracted_answers=answers[start : start + count],
            extra_env_info=[{"ground_truth": "1"}] * count,
            truncated=torch.zeros(count, dtype=torch.bool),
        )

    monkeypatch.setattr(nemo_rl_api, "roll_out_batch", roll_out)


def prompts(count: int) -> list[dict[str, Any]]:
    return [
        {
            "message_log": [{"role": "user", "content": f"q{i}"}],
            "extra_env_info": {},
            "idx": i,
            "task_name": "p",
            "loss_multiplier": 1.0,
        }
        for i in range(count)
    ]


def test_setup_validates_once_and_batches_every_prompt(tmp_path, no_engines):
    config = MasterConfig(**nemo_rl_eval_config(problems_file(tmp_path / "p.jsonl")))
    assert isinstance(config.generation, dict)  # NeMo-RL's script edits the sections as dicts
    generation, dataloader, master_config = setup(config, object(), prompts(5))
    assert isinstance(master_config, EvalMasterConfig) and master_config.generation.num_prompts_per_step == 5
    assert dataloader.batch_size == 5 and [len(b["idx"]) for b in dataloader] == [5]
    assert master_config.data.data_path == str(tmp_path / "p.jsonl")  # NeMo-RL's local form
    assert isinstance(generation, FakeEngines)


def test_setup_refuses_a_bad_key_in_one_line_before_any_engine(tmp_path, no_engines):
    config = nemo_rl_eval_config(problems_file(tmp_path / "p.jsonl"), metric="pass@q")
    with pytest.raises(ConfigError, match=r"eval\.metric"):
        setup(MasterConfig(**config), object(), prompts(2))
    assert "cluster_down" not in no_engines


def test_several_greedy_samples_are_refused_as_nemo_rl_asserts(tmp_path, no_engines):
    config = nemo_rl_eval_config(problems_file(tmp_path / "p.jsonl"), num_tests_per_prompt=2)
    config["generation"]["top_k"] = 1
    with pytest.raises(ConfigError, match=r"eval.num_tests_per_prompt: 2 samples .* generation.top_k=1 \(greedy\)"):
        setup(MasterConfig(**config), object(), prompts(2))


def test_an_unknown_top_level_key_is_kept_then_refused_in_one_line(tmp_path, no_engines):
    config = MasterConfig(**nemo_rl_eval_config(problems_file(tmp_path / "p.jsonl")), evall={"seed": 1})
    assert config.evall == {"seed": 1}  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"^evall: unknown key \(did you mean eval\?\)$"):
        setup(config, object(), prompts(2))


def test_the_script_s_own_config_flag_read_back_as_a_key_is_dropped(tmp_path, no_engines):
    """NeMo-RL's run_eval.py merges OmegaConf.from_cli(), which keeps ``--config=<path>`` as a key."""
    config = MasterConfig(**nemo_rl_eval_config(problems_file(tmp_path / "p.jsonl")), **{"--config": "eval.yaml"})
    assert not hasattr(config, "--config")
    setup(config, object(), prompts(2))


def test_run_env_eval_prints_nemo_rl_s_pass_at_k_and_shuts_down(tmp_path, no_engines, monkeypatch, capsys):
    """2 problems x 2 samples in batches of one problem: pass@1 = 1/2 + 1 summed, 0.75 the mean."""
    config = nemo_rl_eval_config(problems_file(tmp_path / "p.jsonl"), num_tests_per_prompt=2, save_path=None)
    config["generation"]["num_prompts_per_step"] = 1
    generation, dataloader, master_config = setup(MasterConfig(**config), object(), prompts(2))
    fake_rollouts(monkeypatch, [1.0, 0.0, 1.0, 1.0], ["1", "2", "1", "1"])
    env = object()
    assert run_env_eval(generation, dataloader, env, master_config) is None
    out = capsys.readouterr().out
    assert "metric=pass@1 num_tests_per_prompt=2\n" in out
    assert "score=0.7500 (1.5/2)\n" in out
    assert "model_name='tiny-random-llama' dataset_name='p.jsonl'" in out
    assert generation.shut_down and no_engines["env_killed"] is env
    assert no_engines["cluster_down"] and no_engines["model_cleaned"]
    with pytest.raises(UserInputError, match="vllm_generation: pass the generation setup"):
        run_env_eval(generation, dataloader, env, master_config)  # its engines are gone


def test_run_env_eval_cons_at_k_and_saves_nemo_rl_s_folder(tmp_path, no_engines, monkeypatch, capsys):
    """cons@2 of one problem with 3 samples: subsets {0,1}: '7' (first of a tie, wrong), {0,2}: '7', {1,2}: '5'
    (right) → 1/3."""
    save = tmp_path / "out"
    config = nemo_rl_eval_config(
        problems_file(tmp_path / "p.jsonl"), metric="cons@k", num_tests_per_prompt=3, k_value=2, save_path=str(save)
    )
    generation, dataloader, master_config = setup(MasterConfig(**config), object(), prompts(1))
    fake_rollouts(monkeypatch, [0.0, 1.0, 1.0], ["7", "5", "5"])
    run_env_eval(generation, dataloader, object(), master_config)
    assert "score=0.3333 (0.3333333333333333/1)" in capsys.readouterr().out
    saved = json.loads((save / "config.json").read_text())
    assert saved == {
        "model_name": "tiny-random-llama",
        "dataset_name": str(tmp_path / "p.jsonl"),
        "metric": "cons@k",
        "k_value": 2,
        "num_tests_per_prompt": 3,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
    }
    samples = json.loads((save / "evaluation_data.json").read_text())["evaluation_data"]
    assert [s["sample_index"] for s in samples] == [0, 1, 2] and [s["reward"] for s in samples] == [0.0, 1.0, 1.0]
    assert isinstance(samples[0]["message_log"], str) and samples[0]["response"] == "a"
