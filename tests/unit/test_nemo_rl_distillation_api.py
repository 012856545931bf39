"""NeMo-RL v0.7.0's distillation script API, the pure parts (the whole ``run_distillation.py`` runs in
tests/functional/test_nemo_rl_entry_scripts.py): ``setup``'s refusal and ``distillation_train``'s run from NeMo-RL's
thirteen arguments."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

import nemo_rl_clone.algorithms.distillation.nemo_rl_api as distillation_api
from nemo_rl_clone.algorithms.distillation import MasterConfig, distillation_train, setup
from nemo_rl_clone.algorithms.distillation.train import DistillationComponents
from nemo_rl_clone.utils.config import load_config
from nemo_rl_clone.utils.config_validation import as_config
from nemo_rl_clone.utils.errors import UserInputError

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "configs" / "distillation_smoke.yaml"


def nemo_rl_master_config(tmp_path: Path) -> MasterConfig:
    """The distillation smoke recipe as NeMo-RL's script builds it: ``MasterConfig(**plain dict)``."""
    config = OmegaConf.to_container(load_config(SMOKE), resolve=True)
    assert isinstance(config, dict)
    config["logger"]["log_dir"] = tmp_path / "logs" / "exp_1"
    return MasterConfig(**config)


def test_setup_refuses_a_tokenizer_without_a_dataset(tmp_path):
    with pytest.raises(UserInputError, match=r"^train_dataset: required"):
        setup(nemo_rl_master_config(tmp_path), object())


def test_distillation_train_forms_the_run_from_nemo_rl_arguments(tmp_path, monkeypatch):
    trained: list[DistillationComponents] = []
    monkeypatch.setattr(distillation_api, "train_distillation_run", trained.append)
    config = as_config(nemo_rl_master_config(tmp_path), MasterConfig)
    logger = SimpleNamespace(log_dir=tmp_path)
    distillation_train(
        "student", "teacher", "generation", "loader", None, "tok", "loss",
        {"math": "env"}, None, logger, "checkpointer", "state", config,
    )  # fmt: skip
    (c,) = trained
    assert (c.teacher, c.loss_fn, c.config) == ("teacher", "loss", config)
    run = c.run
    assert (run.policy, run.generation, run.dataloader, run.val_dataset) == ("student", "generation", "loader", None)
    assert run.task_to_env == {"math": "env"} and (run.checkpointer, run.state) == ("checkpointer", "state")
    distillation_train(c)  # this library's one-argument form
    assert trained[-1] is c
    with pytest.raises(UserInputError, match=r"^master_config: required"):
        distillation_train("student", "teacher")
    with pytest.raises(UserInputError, match=r"^teacher_policy, loss_fn: required"):
        distillation_train("student", None, master_config=config)
