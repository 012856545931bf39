"""Saving and loading the Megatron distributed optimizer's state, at any TP/PP/DP/EP layout.

The state is saved in the "fully_reshardable" format: one sharded tensor per model parameter and Adam moment, named by
the parameter's global name, so it reloads at another tensor/pipeline/data-parallel layout. Expert parallelism adds a
wrinkle Megatron does not handle: at EP > 1 the optimizer is a chain of two (dense parameters, then experts, each
with its own data-parallel group), and the chain prefixes every name with ``chained_<i>.``; at EP = 1 there is one
optimizer and no prefix. Loading across that change maps each parameter's state by its name without the prefix and
takes the parameter groups (all of which step together) from the loading optimizer, with the saved step count.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import megatron_cpu_shims
import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.mapping import ShardedBase

from nemo_rl_clone.utils.errors import UserInputError

# Megatron's default, "fully_sharded_model_space", relies on flattened sharded tensors that megatron-core 0.16 refuses
# to save; this one reloads at any layout.
_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}
_CHAIN_PREFIX = re.compile(r"^chained_\d+\.")
_NEVER_STEPPED = "optimizer_never_stepped"
# The schedule values Megatron saves and checks on load, and the `policy.megatron_cfg` keys they come from.
_SCHEDULE_KEYS = {
    "max_lr": "optimizer.lr",
    "min_lr": "optimizer.min_lr",
    "lr_warmup_steps": "scheduler.lr_warmup_iters",
    "lr_decay_steps": "scheduler.lr_decay_iters",
    "lr_decay_style": "scheduler.lr_decay_style",
    "start_wd": "scheduler.start_weight_decay",
    "end_wd": "scheduler.end_weight_decay",
    "wd_incr_steps": "train_iters",
    "wd_incr_style": "scheduler.weight_decay_incr_style",
}


def save_distributed(state: dict[str, Any], path: str) -> None:
    """A collective: every rank writes its shards of ``state`` into the folder ``path``."""
    if dist.get_rank() == 0:
        os.makedirs(path, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(state, path)


def save_optimizer(optimizer: Any, scheduler: Any, model_state: dict[str, Any], path: str) -> None:
    """``model_state``: a fresh ``sharded_state_dict()`` of the model (the optimizer maps its parameters through it).
    An optimizer that has not stepped yet (PPO's actor while its critic warms up) has no state Megatron can write:
    only the scheduler is saved, marked so, and loading it leaves a fresh optimizer — which is what it was."""
    with megatron_cpu_shims.cuda_redirect():  # gathering the optimizer state calls `.cuda()`
        if not _has_stepped(optimizer):
            save_distributed({"scheduler": scheduler.state_dict(), _NEVER_STEPPED: True}, path)
            return
        state = {
            "optimizer": optimizer.sharded_state_dict(model_state, metadata=_METADATA),
            "scheduler": scheduler.state_dict(),
        }
        save_distributed(state, path)


def _has_stepped(optimizer: Any) -> bool:
    return any(
        bool(getattr(inner.optimizer, "state", None)) for inner in getattr(optimizer, "chained_optimizers", [optimizer])
    )


def load_optimizer(optimizer: Any, scheduler: Any, model_state: dict[str, Any], path: str) -> None:
    """Loads a `save_optimizer` folder into ``optimizer`` and ``scheduler``, saved at any layout (a collective)."""
    with megatron_cpu_shims.cuda_redirect():
        common = dist_checkpointing.load_common_state_dict(path)
        if common.get(_NEVER_STEPPED):
            optimizer.reload_model_params()  # its main parameters take the loaded weights
            load_schedule(scheduler, common["scheduler"])
            return
        _prepare_optimizer_for_loading(optimizer)
        template = optimizer.sharded_state_dict(model_state, is_loading=True, metadata=_METADATA)
        saved_keys = set(dist_checkpointing.load_tensors_metadata(path))
        if {sharded.key for sharded in _sharded(template)} <= saved_keys:
            state = dist_checkpointing.load({"optimizer": template}, path)
            optimizer.load_state_dict(state["optimizer"])
        else:
            state = _load_across_chains(optimizer, template, path, saved_keys)
        _unshare_adam_steps(optimizer)
        load_schedule(scheduler, state["scheduler"])


def load_schedule(scheduler: Any, saved: dict[str, Any]) -> str | None:
    """Loads a saved schedule: its step count always, its values unless the scheduler was built with
    ``override_opt_param_scheduler``. Returns (and rank 0 prints) one line naming the values where config and
    checkpoint differ and which of them now acts; None where they agree."""
    override = scheduler.override_opt_param_scheduler
    differ = [
        f"policy.megatron_cfg.{key}: checkpoint {saved[name]!r}, config {getattr(scheduler, name)!r}"
        for name, key in _SCHEDULE_KEYS.items()
        if name in saved and saved[name] != getattr(scheduler, name)
    ]
    scheduler.load_state_dict(saved)
    if not differ:
        return None
    notice = (
        f"Resumed LR schedule at step {scheduler.num_steps}: "
        + (
            "the config's values replace the checkpoint's (override_opt_param_scheduler): "
            if override
            else "the checkpoint's values are kept where the config differs "
            "(policy.megatron_cfg.scheduler.override_opt_param_scheduler=true takes the config's): "
        )
        + "; ".join(differ)
    )
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(notice, flush=True)
    return notice


def _load_across_chains(optimizer: Any, template: dict, path: str, saved_keys: set[str]) -> dict[str, Any]:
    """Loads a checkpoint saved by a differently chained optimizer (another expert-parallel size)."""
    saved_by_name = {_CHAIN_PREFIX.sub("", key): key for key in saved_keys}
    structure = _skeleton(template)  # loading replaces the template's sharded objects in place
    for sharded in _sharded(template):
        name = _CHAIN_PREFIX.sub("", sharded.key)
        if name not in saved_by_name:
            raise UserInputError(
                f"optimizer checkpoint {path} has no state for {name!r}: it was saved for another model"
            )
        sharded.key = saved_by_name[name]
    common = dist_checkpointing.load_common_state_dict(path)
    steps = {group["step"] for group in _param_groups(common["optimizer"]) if "step" in group}
    if len(steps) != 1:
        raise UserInputError(f"optimizer checkpoint {path}: its parameter groups disagree on the step count {steps}")
    (step,) = steps
    loaded = dist_checkpointing.load({"optimizer": template}, path)
    state = _fill(structure, loaded["optimizer"])
    for group in _param_groups(state):
        group["step"] = step
    optimizer.load_state_dict(state)
    return loaded


def _sharded(tree: Any) -> Iterator[ShardedBase]:
    if isinstance(tree, ShardedBase):
        yield tree
    elif isinstance(tree, dict):
        for value in tree.values():
            yield from _sharded(value)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            yield from _sharded(value)


class _Loaded:
    """Marks where a `_skeleton` had a sharded object (whose tensor `_fill` takes from the loaded state)."""


def _skeleton(tree: Any) -> Any:
    """``tree``'s containers rebuilt with each sharded object replaced by `_Loaded` (its tensors are not copied)."""
    if isinstance(tree, ShardedBase):
        return _Loaded
    if isinstance(tree, dict):
        return {key: _skeleton(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_skeleton(value) for value in tree)
    return tree


def _fill(structure: Any, loaded: Any) -> Any:
    """``structure`` (a `_skeleton`) with each `_Loaded` replaced by what ``loaded`` holds at the same place."""
    if structure is _Loaded:
        return loaded
    if isinstance(structure, dict):
        return {key: _fill(value, loaded[key]) if _holds_loaded(value) else value for key, value in structure.items()}
    if isinstance(structure, (list, tuple)):
        values = (_fill(v, loaded[i]) if _holds_loaded(v) else v for i, v in enumerate(structure))
        return type(structure)(values)
    return structure


def _holds_loaded(tree: Any) -> bool:
    if tree is _Loaded:
        return True
    if isinstance(tree, dict):
        return any(_holds_loaded(value) for value in tree.values())
    return isinstance(tree, (list, tuple)) and any(_holds_loaded(value) for value in tree)


def _param_groups(tree: Any) -> Iterator[dict[str, Any]]:
    """Every parameter group of a (chained) optimizer state dict."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            if key == "param_groups" and isinstance(value, list):
                yield from value
            else:
                yield from _param_groups(value)


def _prepare_optimizer_for_loading(optimizer: Any) -> None:
    """Two gaps of megatron-core 0.16's distributed optimizer without Apex/Transformer Engine (torch's Adam, whose
    state holds a per-parameter ``step``), filled before loading its checkpoint:

    - its state dict reads that ``step``, which exists only after a step: Megatron's own zero-gradient dummy step
      allocates the state (it moves only this rank's main-parameter shard, by the weight decay, and the loaded
      ``fp32_param`` overwrites that shard);
    - loading the "fully_reshardable" parameter state copies every state tensor but ``step`` (restored from the
      param groups beforehand) and fails on the missing key: the current ``step`` is passed through.
    """
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        if not hasattr(inner, "_init_optimizer_states_with_dummy_values"):
            continue  # not a DistributedOptimizer
        if not inner.optimizer.state:
            inner._init_optimizer_states_with_dummy_values()
        if getattr(inner.config, "use_precision_aware_optimizer_no_fp8_or_ds_fp8", False) or getattr(
            inner, "_passes_step_through", False
        ):
            continue
        upstream = inner._set_main_param_and_optimizer_states

        def set_states(model_param: Any, tensors: dict[str, Any], _inner: Any = inner, _upstream: Any = upstream):
            group_index, group_order = _inner.model_param_group_index_map[model_param]
            main_param = _inner.optimizer.param_groups[group_index]["params"][group_order]
            step = _inner.optimizer.state[main_param].get("step")
            if "step" not in tensors and step is not None:
                tensors = {**tensors, "step": step}
            _upstream(model_param, tensors)

        inner._set_main_param_and_optimizer_states = set_states
        inner._passes_step_through = True


def _unshare_adam_steps(optimizer: Any) -> None:
    """After loading, megatron-core 0.16's distributed optimizer (without Apex/TE) gives every parameter's torch
    Adam state one shared ``step`` tensor, which torch's Adam then increments in place once per parameter: the bias
    corrections of the next step go wrong. Each parameter gets its own copy."""
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        for param_state in getattr(inner.optimizer, "state", {}).values():
            if torch.is_tensor(param_state.get("step")):
                param_state["step"] = param_state["step"].clone()
