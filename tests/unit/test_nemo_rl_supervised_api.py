"""NeMo-RL v0.7.0's SFT / DPO / RM script API, the pure parts (the scripts run in
tests/functional/test_nemo_rl_entry_scripts.py): ``setup``'s refusal, the run ``*_train`` forms from NeMo-RL's nine
arguments (`supervised.nemo_rl_api.run_from_parts`), ``setup_preference_data`` and the ``data.datasets`` functions
``run_sft.py`` builds its datasets with."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from nemo_rl_clone.algorithms import dpo, rm, sft
from nemo_rl_clone.algorithms.dpo.config import DPOAlgorithm
from nemo_rl_clone.algorithms.dpo.train import DPO_ENTRY
from nemo_rl_clone.algorithms.sft.config import SFTAlgorithm
from nemo_rl_clone.algorithms.sft.train import SFT_ENTRY
from nemo_rl_clone.algorithms.supervised.nemo_rl_api import run_from_parts
from nemo_rl_clone.data.datasets import (
    AllTaskProcessedDataset,
    load_response_dataset,
    merge_datasets,
    update_single_dataset_config,
)
from nemo_rl_clone.data.utils import setup_preference_data
from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer
from nemo_rl_clone.utils.config import load_config
from nemo_rl_clone.utils.config_validation import ConfigError
from nemo_rl_clone.utils.errors import UserInputError

REPO = Path(__file__).resolve().parents[2]


def nemo_rl_master_config(name: str, tmp_path: Path, **loop: object) -> object:
    """``configs/<name>_smoke.yaml`` as NeMo-RL's script builds it: ``MasterConfig(**plain dict)``, dict sections."""
    config = OmegaConf.to_container(load_config(REPO / "configs" / f"{name}_smoke.yaml"), resolve=True)
    assert isinstance(config, dict)
    config["logger"]["log_dir"] = tmp_path / "logs" / "exp_1"  # a pathlib.Path, as get_next_experiment_dir gives
    config[name].update(loop)
    module = {"sft": sft, "dpo": dpo, "rm": rm}[name]
    return module.MasterConfig(**config)


@pytest.mark.parametrize("module", [sft, dpo, rm], ids=["sft", "dpo", "rm"])
def test_setup_in_nemo_rl_form_needs_the_training_dataset(module, tmp_path):
    config = nemo_rl_master_config(module.__name__.rsplit(".", 1)[-1], tmp_path)
    with pytest.raises(UserInputError, match=r"^tokenizer, train_dataset: both required"):
        module.setup(config, object())


def records(tmp_path: Path) -> tuple[object, str, str]:
    return SimpleNamespace(log_dir=tmp_path), "checkpointer", "state"


def test_train_arguments_form_the_run_with_its_validation_batches(tmp_path):
    config = nemo_rl_master_config("dpo", tmp_path, val_global_batch_size=2, val_batches=1, val_period=1)
    val_loader = SimpleNamespace(dataset=["p1", "p2", "p3", "p4"], collate_fn=lambda pairs: tuple(pairs))
    run = run_from_parts(DPO_ENTRY, "policy", ("loader", val_loader), "tok", "loss", config, records(tmp_path))
    assert isinstance(run.algorithm, DPOAlgorithm) and run.algorithm.loss_fn == "loss"
    assert run.val_batches == [("p1", "p2")]  # the first val_batches full batches of the validation set
    assert (run.policy, run.dataloader, run.tokenizer, run.cluster) == ("policy", "loader", "tok", None)
    assert (run.checkpointer, run.state, run.log_dir) == ("checkpointer", "state", tmp_path)
    assert run.config.dpo.val_global_batch_size == 2 and run.loop is run.config.dpo  # validated, typed


def test_train_arguments_without_validation_and_without_a_config(tmp_path):
    config = nemo_rl_master_config("sft", tmp_path, val_period=0, val_at_start=False)
    run = run_from_parts(SFT_ENTRY, "policy", ("loader", None), "tok", "loss", config, records(tmp_path))
    assert isinstance(run.algorithm, SFTAlgorithm) and run.val_batches == []
    with pytest.raises(UserInputError, match=r"^master_config: required"):
        sft.sft_train("policy", "loader", None, "tok", "loss", None, *records(tmp_path))


def test_setup_preference_data_loads_the_pairs_of_a_data_section(tmp_path):
    rows = [{"prompt": f"What is {i} + 1?", "chosen": str(i + 1), "rejected": str(i + 2)} for i in range(6)]
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    data = {
        "max_input_seq_length": 64,
        "train": {"dataset_name": "binary_preference", "data_path": path, "split_validation_size": 0.5},
    }
    tokenizer = load_tokenizer(TINY_LLAMA)
    dataset, val_dataset = setup_preference_data(tokenizer, data)
    assert len(dataset) == len(val_dataset) == 3
    assert {"message_log_chosen", "message_log_rejected", "loss_multiplier"} <= set(dataset[0])
    given_validation = {**data, "validation": {"data_path": str(path)}}
    given_validation["train"] = {"dataset_name": "binary_preference", "data_path": str(path)}
    assert [len(split) for split in setup_preference_data(tokenizer, given_validation)] == [6, 6]
    with pytest.raises(ConfigError, match=r"data\.max_input_seq_lenght: unknown key"):
        setup_preference_data(tokenizer, {**data, "max_input_seq_lenght": 1})


def squad_rows(path: Path, rows: int = 4) -> Path:
    lines = [
        {"context": f"Anna has {i} apples.", "question": "How many?", "answers": {"text": [str(i)]}}
        for i in range(rows)
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def test_run_sft_data_functions_build_the_sft_datums(tmp_path):
    entry = {"dataset_name": "squad", "data_path": str(squad_rows(tmp_path / "squad.jsonl"))}
    update_single_dataset_config(entry, {"processor": "sft_processor", "prompt_file": None, "dataset_name": "x"})
    assert entry["dataset_name"] == "squad" and entry["processor"] == "sft_processor"  # only missing keys filled
    data = load_response_dataset(entry)
    assert (data.task_name, data.val_dataset, data.preprocessor) == ("squad", None, None)
    merged = merge_datasets([data.dataset, data.dataset])
    assert len(merged) == 8 and merge_datasets([data.dataset]) is data.dataset
    tokenizer = load_tokenizer(TINY_LLAMA)
    processor = partial(data.processor, add_bos=False, add_eos=True, add_generation_prompt=False)
    dataset = AllTaskProcessedDataset(
        merged, tokenizer, None, {"squad": (data.task_spec, processor)}, max_seq_length=64
    )
    datum = dataset[5]
    assert datum["idx"] == 5 and datum["loss_multiplier"] == 1.0 and datum["extra_env_info"] is None
    assert [m["role"] for m in datum["message_log"]] == ["system", "user", "assistant"]
    assert datum["message_log"][-1]["token_loss_mask"].all() and not datum["message_log"][0]["token_loss_mask"].any()
    with pytest.raises(UserInputError, match=r"^data\.processor: not supported yet: 'no_such_processor'"):
        load_response_dataset({**entry, "processor": "no_such_processor"})
    with pytest.raises(ValueError, match="at least one"):
        merge_datasets([])
