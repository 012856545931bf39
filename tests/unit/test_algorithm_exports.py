"""Each algorithm's module exports NeMo-RL's names: ``MasterConfig``, ``setup`` and its train function, and ``setup``
accepts NeMo-RL's master config as a plain dict (validated first, so a bad one fails before anything starts)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from nemo_rl_clone.utils.config import load_config, load_validated_config, resolve_to_container
from nemo_rl_clone.utils.config_validation import ConfigError, as_config

REPO = Path(__file__).resolve().parents[2]
# algorithm module → (train function, section, smoke recipe, master config class name)
ALGORITHMS = {
    "grpo": ("grpo_train", "grpo", "grpo_smoke.yaml", "GRPOMasterConfig"),
    "sft": ("sft_train", "sft", "sft_smoke.yaml", "SFTMasterConfig"),
    "dpo": ("dpo_train", "dpo", "dpo_smoke.yaml", "DPOMasterConfig"),
    "rm": ("rm_train", "rm", "rm_smoke.yaml", "RMMasterConfig"),
    "distillation": ("distillation_train", "distillation", "distillation_smoke.yaml", "DistillationMasterConfig"),
}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_nemo_rl_names_are_exported(name: str) -> None:
    train, section, recipe, schema_name = ALGORITHMS[name]
    module = importlib.import_module(f"nemo_rl_clone.algorithms.{name}")
    assert callable(module.setup) and callable(getattr(module, train))
    assert module.MasterConfig.__name__ == schema_name
    # A dict (what NeMo-RL's scripts pass) validates to the same config the YAML loader builds.
    plain = resolve_to_container(load_config(REPO / "configs" / recipe))
    from_yaml = load_validated_config(REPO / "configs" / recipe, [], module.MasterConfig)
    assert as_config(plain, module.MasterConfig) == from_yaml
    with pytest.raises(ConfigError) as err:
        module.setup({**plain, section: {**plain[section], "max_num_stpes": 3}})
    assert f"{section}.max_num_stpes: unknown key" in err.value.problems[0]
