"""NeMo-RL-shaped recipe configs, built from the table of NeMo-RL v0.7.0's recipe keys (tests/data).

A NeMo-RL recipe inherits its algorithm's base file (``grpo_math_1B.yaml``, ``sft.yaml``, ``dpo.yaml``, ``rm.yaml``),
so a key that every recipe of an algorithm sets is a key of that base file. ``base_recipe(algorithm)`` rebuilds such a
base from the table: every key set by at least as many recipes as the algorithm has, at the value the table records,
with the few values the table took from a more specific recipe put back to the base's (``BASE_VALUES``). The result
is NeMo-RL's structure written out by us, not a copy of its files.
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TABLE = Path(__file__).resolve().parents[1] / "data" / "nemo_rl_v0.7.0_recipe_keys.tsv"

# How many of the table's recipes each algorithm has (the count of the keys only that algorithm's recipes set).
RECIPES_PER_ALGORITHM = {"grpo": 134, "sft": 27, "dpo": 12, "rm": 1}

# Keys that reach an algorithm's threshold only because recipes of *other* algorithms set them too (MoE recipes'
# automodel backends, per-recipe allocator settings): not part of the base file.
NOT_IN_BASE = (
    "policy.dtensor_cfg.automodel_kwargs.",
    "policy.dtensor_cfg.expert_parallel_size",
    "policy.dtensor_cfg.clear_cache_every_n_steps",
    "policy.dtensor_cfg.env_vars.",
    "policy.megatron_cfg.env_vars.",
    "data.validation.",
    "policy.optimizer",  # added back below: the DTensor bases set it, the Megatron ones null it
)

# Values of the base files where the table's example comes from another recipe.
BASE_VALUES: dict[str, dict[str, Any]] = {
    "all": {
        "policy.model_name": "meta-llama/Llama-3.2-1B-Instruct",
        "policy.megatron_cfg.tensor_model_parallel_size": 1,
        "policy.megatron_cfg.num_layers_in_first_pipeline_stage": None,
        "policy.megatron_cfg.num_layers_in_last_pipeline_stage": None,
        "policy.optimizer.name": "torch.optim.AdamW",
        "policy.optimizer.kwargs.lr": 5.0e-6,
        "policy.optimizer.kwargs.weight_decay": 0.1,
        "policy.optimizer.kwargs.betas": [0.9, 0.98],
        "policy.optimizer.kwargs.eps": 1e-5,
        "policy.optimizer.kwargs.foreach": False,
        "policy.optimizer.kwargs.fused": False,
    },
    "grpo": {
        "data.train.dataset_name": "OpenMathInstruct-2",
        "checkpointing.metric_name": "val:accuracy",
        "checkpointing.higher_is_better": True,
        "policy.train_global_batch_size": 512,
        "policy.train_micro_batch_size": 4,
        "policy.max_total_sequence_length": 512,
        "loss_fn.ratio_clip_c": None,
        "loss_fn.truncated_importance_sampling_ratio": None,
        "policy.generation.top_k": None,
        "policy.generation.stop_token_ids": None,
    },
    "sft": {
        "data.train.dataset_name": "squad",
        "data.train.seed": "${sft.seed}",
        "checkpointing.metric_name": "val:val_loss",
    },
    "dpo": {"data.validation": None},
    "rm": {"data.validation": None, "checkpointing.save_period": "${rm.val_period}"},
}


@dataclass(frozen=True)
class KeyRow:
    key: str
    recipes: int
    algorithms: tuple[str, ...]
    example: Any


@functools.cache
def key_rows() -> tuple[KeyRow, ...]:
    rows = []
    lines = [line for line in TABLE.read_text().splitlines() if line and not line.startswith("#")]
    for line in lines[1:]:
        key, recipes, algorithms, example = line.split("\t")
        rows.append(KeyRow(key, int(recipes), tuple(algorithms.split(",")), _parse(example)))
    return tuple(rows)


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # an interpolation such as ${mul:${a}, ${b}} is kept as text and resolved by OmegaConf


def set_dotted(config: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = config
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = copy.deepcopy(value)


def base_recipe(algorithm: str, backend: str = "dtensor") -> dict[str, Any]:
    """A fresh copy of :func:`_base_recipe` (callers edit it)."""
    return copy.deepcopy(_base_recipe(algorithm, backend))


@functools.cache
def _base_recipe(algorithm: str, backend: str) -> dict[str, Any]:
    """The base recipe of ``algorithm`` as NeMo-RL v0.7.0 lays it out; ``backend='megatron'`` is its Megatron
    variant (``grpo_math_1B_megatron.yaml``: Megatron enabled, DTensor off, optimizer and scheduler from
    ``megatron_cfg``)."""
    threshold = RECIPES_PER_ALGORITHM[algorithm]
    config: dict[str, Any] = {}
    rows = sorted(key_rows(), key=lambda r: r.key.count("."))  # parents (e.g. `logger.tensorboard: {}`) first
    for row in rows:
        if algorithm not in row.algorithms or row.recipes < threshold or row.key.startswith(NOT_IN_BASE):
            continue
        if isinstance(row.example, dict) and not row.example and _has_children(config, row.key):
            continue
        set_dotted(config, row.key, row.example)
    for key, value in {**BASE_VALUES["all"], **BASE_VALUES.get(algorithm, {})}.items():
        set_dotted(config, key, value)
    if backend == "megatron":
        set_dotted(config, "policy.dtensor_cfg.enabled", False)
        set_dotted(config, "policy.megatron_cfg.enabled", True)
        set_dotted(config, "policy.optimizer", None)
        set_dotted(config, "policy.scheduler", None)
        set_dotted(config, "policy.megatron_cfg.sequence_parallel", False)  # the table's true is a TP>1 recipe's
    return config


def _has_children(config: dict[str, Any], key: str) -> bool:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return bool(node)
