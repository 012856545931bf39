"""NeMo-RL v0.7.0 recipes carry over: their base files validate unchanged, and every key of every one of their
recipes is accepted (implemented, mapped or inert at that value) or refused with one "not supported yet" line —
never "unknown key", never a type error.

The recipes are rebuilt from the table of NeMo-RL's recipe keys (``nemo_rl_recipes.py``), written to YAML and loaded
through the same path as ``examples/run_*.py --config FILE`` (inheritance, interpolation, validation).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from nemo_rl_clone.algorithms.dpo import DPOMasterConfig
from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
from nemo_rl_clone.algorithms.rm import RMMasterConfig
from nemo_rl_clone.algorithms.sft import SFTMasterConfig
from nemo_rl_clone.utils.config import load_validated_config
from nemo_rl_clone.utils.config_validation import ConfigError
from tests.unit.nemo_rl_recipes import KeyRow, base_recipe, key_rows, set_dotted

SCHEMAS: dict[str, type] = {
    "grpo": GRPOMasterConfig,
    "sft": SFTMasterConfig,
    "dpo": DPOMasterConfig,
    "rm": RMMasterConfig,
}

# NeMo-RL's five base recipes the issue names, by (algorithm, policy backend).
BASE_RECIPES = {
    "grpo_math_1B.yaml": ("grpo", "dtensor"),
    "grpo_math_1B_megatron.yaml": ("grpo", "megatron"),
    "sft.yaml": ("sft", "dtensor"),
    "dpo.yaml": ("dpo", "dtensor"),
    "rm.yaml": ("rm", "dtensor"),
}


def _validate(config: dict[str, Any], algorithm: str, tmp_path: Path) -> list[str]:
    """Problems of ``config`` as the examples report them (empty when it validates)."""
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.dump(config, Dumper=yaml.CSafeDumper, sort_keys=False))  # libyaml: ~10x faster
    try:
        load_validated_config(path, [], SCHEMAS[algorithm])
    except ConfigError as err:
        return err.problems
    return []


@pytest.mark.parametrize("name", sorted(BASE_RECIPES))
def test_nemo_rl_base_recipe_validates_unchanged(name: str, tmp_path: Path) -> None:
    algorithm, backend = BASE_RECIPES[name]
    assert _validate(base_recipe(algorithm, backend), algorithm, tmp_path) == []


def _row_id(row: KeyRow) -> str:
    return row.key


# Keys NeMo-RL only accepts together with another one: every recipe that sets the first sets the second too.
COMPANIONS: dict[str, dict[str, Any]] = {
    "loss_fn.truncated_importance_sampling_ratio": {"loss_fn.use_importance_sampling_correction": True},
    # Uneven pipeline stages: recipes with pipeline parallelism on enough GPUs.
    "policy.megatron_cfg.num_layers_in_first_pipeline_stage": {
        "policy.megatron_cfg.pipeline_model_parallel_size": 2,
        "cluster.gpus_per_node": 2,
    },
    "policy.megatron_cfg.num_layers_in_last_pipeline_stage": {
        "policy.megatron_cfg.pipeline_model_parallel_size": 2,
        "cluster.gpus_per_node": 2,
    },
}


def _recipe_setting(row: KeyRow) -> tuple[str, dict[str, Any]]:
    """The base recipe of the first of the key's algorithms, with the key set at the value the table records, plus
    the rest of its section where the base has none (an ``env.reward_model`` key comes with the whole section, as in
    the recipe that has it). Megatron keys, and the null optimizer of Megatron recipes, are tried on the Megatron
    variant, where they take effect."""
    algorithm = next(a for a in ("grpo", "sft", "dpo", "rm") if a in row.algorithms)
    megatron = row.key.startswith("policy.megatron_cfg.") and row.key != "policy.megatron_cfg.enabled"
    megatron |= row.key == "policy.optimizer" and row.example is None
    config = base_recipe(algorithm, "megatron" if megatron else "dtensor")
    parts = row.key.split(".")
    section = ".".join(parts[:2]) if parts[0] == "env" else ".".join(parts[:-1])
    if section and not _has(config, section):
        for sibling in key_rows():
            if sibling.key.startswith(section + ".") and algorithm in sibling.algorithms:
                set_dotted(config, sibling.key, sibling.example)
    for key, value in COMPANIONS.get(row.key, {}).items():
        set_dotted(config, key, value)
    set_dotted(config, row.key, row.example)
    return algorithm, config


def _has(config: dict[str, Any], key: str) -> bool:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


@pytest.mark.parametrize("row", key_rows(), ids=_row_id)
def test_every_nemo_rl_recipe_key_has_a_fate(row: KeyRow, tmp_path: Path) -> None:
    algorithm, config = _recipe_setting(row)
    problems = _validate(config, algorithm, tmp_path)
    unknown = [p for p in problems if "unknown key" in p or ": expected " in p]
    assert not unknown, f"{row.key}={row.example!r}: {unknown}"
    # Refused: every line says so and why; never a line about something else the key broke.
    assert all("not supported yet" in p for p in problems), f"{row.key}={row.example!r}: {problems}"


def test_table_covers_all_four_algorithms() -> None:
    rows = key_rows()
    assert len(rows) > 400
    assert {a for row in rows for a in row.algorithms} == set(SCHEMAS)
