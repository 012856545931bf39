"""The ``env`` config: built-in sections, a user's environment named by its class path, and the rows' routing."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
from nemo_rl_clone.environments.config import (
    CustomEnvConfig,
    EnvConfig,
    MathEnvConfig,
    ReasoningGymEnvConfig,
    SlidingPuzzleEnvConfig,
)
from nemo_rl_clone.utils.config_validation import ConfigError, config_to_dict, validate_config

USER_MODULE = """
from dataclasses import dataclass

from nemo_rl_clone.environments.interfaces import EnvironmentInterface


@dataclass
class ShoutConfig:
    exclamations: int = 1

    def check(self):
        return [] if self.exclamations >= 1 else [("exclamations", f"must be >= 1, got {self.exclamations}")]


class Shout(EnvironmentInterface):
    config_class = ShoutConfig

    def __init__(self, cfg):
        self.cfg = cfg

    def step(self, message_log_batch, metadata):
        raise NotImplementedError

    def global_post_process_and_metrics(self, batch):
        return batch, {}


class NoSchema(Shout):
    config_class = None
"""


@pytest.fixture
def user_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "my_envs").mkdir()
    (tmp_path / "my_envs" / "__init__.py").write_text("")
    (tmp_path / "my_envs" / "shout.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_envs.shout"


def grpo(env: Any, **data: Any) -> GRPOMasterConfig:
    return validate_config({"env": env, "data": {"dataset_name": "OpenMathInstruct-2", **data}}, GRPOMasterConfig)


def problems(env: Any, **data: Any) -> list[str]:
    with pytest.raises(ConfigError) as error:
        grpo(env, **data)
    return error.value.problems


def test_builtin_sections_and_defaults() -> None:
    assert validate_config({}, GRPOMasterConfig).env == {"math": MathEnvConfig()}  # no env section: math
    config = grpo(
        {"math": None, "reasoning_gym": {"num_workers": 3}, "sliding_puzzle_game": {}}, env_name="reasoning_gym"
    )
    assert config.env == {
        "reasoning_gym": ReasoningGymEnvConfig(num_workers=3),
        "sliding_puzzle_game": SlidingPuzzleEnvConfig(),
    }
    assert isinstance(config.env, EnvConfig)
    # config.yaml of a run holds the sections as plain mappings (YAML cannot write the section's own class).
    saved = yaml.safe_load(yaml.safe_dump(config_to_dict(config)))["env"]
    assert saved["reasoning_gym"]["num_workers"] == 3 and saved["sliding_puzzle_game"]["cfg"]["max_moves"] == 8
    assert grpo(saved, env_name="reasoning_gym").env == config.env


def test_user_environment_is_named_by_class_path_and_its_cfg_validated_by_its_schema(user_package: str) -> None:
    config = grpo({"shouting": {"env_class": f"{user_package}.Shout", "cfg": {"exclamations": 3}}}, env_name="shouting")
    section = config.env["shouting"]
    assert isinstance(section, CustomEnvConfig) and section.env_class == f"{user_package}.Shout"
    assert type(section.cfg).__name__ == "ShoutConfig" and section.cfg.exclamations == 3
    assert grpo({"s": {"env_class": f"{user_package}.Shout"}}, env_name="s").env["s"].cfg.exclamations == 1
    # Without a config_class the section's cfg is handed over as it is.
    assert grpo({"s": {"env_class": f"{user_package}.NoSchema", "cfg": {"a": 1}}}, env_name="s").env["s"].cfg == {
        "a": 1
    }


def test_bad_environment_sections_are_named(user_package: str) -> None:
    found = problems(
        {
            "mth": {},
            "a": {"env_class": f"{user_package}.Shout", "cfg": {"exclamations": 0, "volume": 2}},
            "b": {"env_class": "not_a_module.Env"},
            "c": {"env_class": f"{user_package}.Whisper"},
            "d": {"env_class": "Shout"},
            "math": {"num_workrs": 2},
        }
    )
    assert found == [
        "env.mth: unknown environment (did you mean env.math?); built-in: math, math_multi_reward, reasoning_gym, sliding_puzzle_game, tool_use, code, code_jaccard, reward_model, agent; "
        "for your own, name its class: env.mth.env_class: package.module.Class",
        "env.a.cfg.volume: unknown key",
        "env.a.cfg.exclamations: must be >= 1, got 0",
        "env.b.env_class: cannot import 'not_a_module.Env' (module 'not_a_module': No module named 'not_a_module')",
        f"env.c.env_class: cannot import '{user_package}.Whisper'",
        "env.d.env_class: 'Shout' is not a dotted class path (package.module.Class)",
        "env.math.num_workrs: unknown key (did you mean env.math.num_workers?)",
    ]
    assert problems({"a": {"env_class": f"{user_package}.Shout", "cfg": {"exclamations": 0}}}) == [
        "env.a.cfg.exclamations: must be >= 1, got 0"
    ]


def test_the_rows_environment_must_be_configured() -> None:
    assert problems({"math": None, "reasoning_gym": {}}) == [
        "env.math: required: this environment scores the rows (data.dataset_name: 'OpenMathInstruct-2'); configured "
        "environments: reasoning_gym"
    ]
    assert problems({"math": {}}, env_name="game") == [
        "env.game: required: this environment scores the rows (data.env_name: 'game'); configured environments: math"
    ]
