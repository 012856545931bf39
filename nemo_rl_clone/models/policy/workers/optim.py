"""Optimizer and LR scheduler from the ``policy.optimizer`` / ``policy.scheduler`` config (class path + kwargs).

The scheduler config is NeMo-RL's list format: ``{name, kwargs}`` entries, chained by one optional
``{milestones: [...]}`` entry through ``torch.optim.lr_scheduler.SequentialLR``; no list means a constant LR.
Both are built once on the driver against a dummy parameter (``check_optimizer_and_scheduler``) so that a typo in a
class path or a bad kwarg (``lr: abc``) fails before any worker starts, as one line naming the key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from nemo_rl_clone.models.policy.config import OptimizerConfig
from nemo_rl_clone.utils import imports
from nemo_rl_clone.utils.errors import UserInputError


class OptimizerConfigError(UserInputError, ValueError):
    """``policy.optimizer`` / ``policy.scheduler`` name a class that does not exist or kwargs it rejects."""


def import_by_path(path: str, key: str) -> Any:
    """The object at dotted ``path`` (e.g. ``torch.optim.AdamW``); a `OptimizerConfigError` naming the config
    ``key`` and, where there is one, the nearest existing name (``policy.optimizer.name: cannot import
    'torch.optim.AdamWW' (did you mean torch.optim.AdamW?)``)."""
    try:
        return imports.import_by_path(path)
    except ImportError as error:
        raise OptimizerConfigError(f"{key}: {error}") from None


def check_import_paths(optimizer: OptimizerConfig | None, scheduler: Sequence[Mapping[str, Any]] | None) -> None:
    """Resolve every class path of the optimizer and scheduler config; raise on the first that does not exist.
    Null (the Megatron backend, which builds its own optimizer) has none."""
    if optimizer is not None:
        import_by_path(optimizer.name, "policy.optimizer.name")
    for index, entry in enumerate(scheduler or []):
        if "name" in entry:
            import_by_path(entry["name"], f"policy.scheduler[{index}].name")


def build_optimizer(params: Iterable[torch.nn.Parameter], config: OptimizerConfig) -> torch.optim.Optimizer:
    """``cls(params, **kwargs)`` for ``config.name``; YAML lists in kwargs (``betas: [0.9, 0.999]``) become tuples."""
    optimizer_class = import_by_path(config.name, "policy.optimizer.name")
    kwargs = {name: tuple(value) if isinstance(value, list) else value for name, value in config.kwargs.items()}
    try:
        return optimizer_class(params, **kwargs)
    except (TypeError, ValueError) as error:  # torch raises both for bad values (lr="abc", lr=-1)
        raise OptimizerConfigError(f"policy.optimizer.kwargs: {config.name} rejected {kwargs}: {error}") from None


def build_scheduler(
    optimizer: torch.optim.Optimizer, entries: Sequence[Mapping[str, Any]] | None
) -> torch.optim.lr_scheduler.LRScheduler:
    """The LR scheduler of NeMo-RL's list format; ``None`` or ``[]`` gives a constant LR (``LambdaLR`` of 1)."""
    entries = list(entries or [])
    milestones = [list(entry["milestones"]) for entry in entries if "milestones" in entry]
    schedulers = []
    for index, entry in enumerate(entries):
        if "milestones" in entry:
            continue
        scheduler_class = import_by_path(entry["name"], f"policy.scheduler[{index}].name")
        try:
            schedulers.append(scheduler_class(optimizer, **dict(entry.get("kwargs") or {})))
        except (TypeError, ValueError) as error:
            raise OptimizerConfigError(
                f"policy.scheduler[{index}].kwargs: {entry['name']} rejected them: {error}"
            ) from None
    if not schedulers:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    if len(schedulers) == 1:
        return schedulers[0]
    if len(milestones) != 1 or len(milestones[0]) != len(schedulers) - 1:
        raise OptimizerConfigError(
            f"policy.scheduler: {len(schedulers)} schedulers need one {{milestones: [...]}} entry with "
            f"{len(schedulers) - 1} values, got {milestones}"
        )
    return torch.optim.lr_scheduler.SequentialLR(optimizer, schedulers, milestones=milestones[0])


def check_optimizer_and_scheduler(optimizer: OptimizerConfig, scheduler: Sequence[Mapping[str, Any]] | None) -> None:
    """Build the optimizer and scheduler against one dummy parameter and take one scheduler step, as the workers
    will; raises `OptimizerConfigError` naming the key. Takes milliseconds, so it runs before any worker starts."""
    dummy = torch.nn.Parameter(torch.zeros(1))
    built = build_optimizer([dummy], optimizer)
    lr_scheduler = build_scheduler(built, scheduler)
    try:
        built.step()
        lr_scheduler.step()
    except (TypeError, ValueError, ZeroDivisionError) as error:
        raise OptimizerConfigError(f"policy.optimizer / policy.scheduler: the first step fails: {error}") from None
