"""NeMo-RL v0.7.0's PPO script API, the pure parts (the whole ``run_ppo.py`` runs in
tests/functional/test_nemo_rl_entry_scripts.py): ``MasterConfig(**config)`` with dict sections validated once,
``setup``'s refusals and ``ppo_train``'s run from NeMo-RL's fourteen arguments."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

import nemo_rl_clone.algorithms.ppo.nemo_rl_api as ppo_api
from nemo_rl_clone.algorithms.ppo import MasterConfig, ppo_train, setup
from nemo_rl_clone.algorithms.ppo.config import PPOMasterConfig
from nemo_rl_clone.algorithms.ppo.train import PPOComponents
from nemo_rl_clone.utils.config import load_config
from nemo_rl_clone.utils.config_validation import as_config
from nemo_rl_clone.utils.errors import UserInputError

REPO = Path(__file__).resolve().parents[2]


def nemo_rl_master_config(tmp_path: Path) -> MasterConfig:
    """The PPO smoke recipe as NeMo-RL's script builds it: ``MasterConfig(**plain dict)``, sections still dicts."""
    config = OmegaConf.to_container(load_config(REPO / "configs" / "ppo_smoke.yaml"), resolve=True)
    assert isinstance(config, dict)
    config["logger"]["log_dir"] = tmp_path / "logs" / "exp_1"
    return MasterConfig(**config)


def test_master_config_is_ours_and_dict_sections_are_validated_once(tmp_path):
    assert MasterConfig is PPOMasterConfig
    config = nemo_rl_master_config(tmp_path)
    config.ppo["max_num_steps"] = 7  # the script edits sections as dicts
    validated = as_config(config, MasterConfig)
    assert validated.ppo.max_num_steps == 7 and validated.logger.log_dir == str(tmp_path / "logs" / "exp_1")


def test_setup_refuses_before_starting_anything(tmp_path):
    config = nemo_rl_master_config(tmp_path)
    with pytest.raises(UserInputError, match=r"^dataset: required"):
        setup(config, object())
    with pytest.raises(UserInputError, match=r"^processor: not supported yet"):
        setup(config, object(), [], None, processor=object())


def test_ppo_train_forms_the_run_from_nemo_rl_arguments(tmp_path, monkeypatch):
    trained: list[PPOComponents] = []
    monkeypatch.setattr(ppo_api, "train_ppo_run", trained.append)
    config = as_config(nemo_rl_master_config(tmp_path), MasterConfig)
    logger = SimpleNamespace(log_dir=tmp_path)
    val_loader = SimpleNamespace(dataset=["v"])
    ppo_train(
        "policy", "generation", "critic", "loader", val_loader, "tok", "loss", "value_loss",
        {"math": "env"}, {"math": "val-env"}, logger, "checkpointer", "state", config,
    )  # fmt: skip
    (c,) = trained
    assert (c.critic, c.value_loss_fn, c.config) == ("critic", "value_loss", config)
    run = c.run
    assert (run.policy, run.generation, run.loss_fn, run.dataloader) == ("policy", "generation", "loss", "loader")
    assert run.val_dataset == ["v"] and run.task_to_env == {"math": "env"} and run.state == "state"
    ppo_train(c)  # this library's one-argument form
    assert trained[-1] is c
    with pytest.raises(UserInputError, match=r"^master_config: required"):
        ppo_train("policy", "generation", "critic")
    with pytest.raises(UserInputError, match=r"^value_model, value_loss_fn: required"):
        ppo_train("policy", "generation", None, master_config=config)
