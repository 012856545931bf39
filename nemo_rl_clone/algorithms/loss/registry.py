"""Losses by name: ``loss_fn.name`` picks the loss a run trains with, `build_loss` builds it for every setup.

``loss_fn`` stays NeMo-RL's section; ``name`` (ours) is a registered name or an import path
``"package.module:Class"``, absent for the algorithm's own loss. The class is called with the algorithm's arguments:
GRPO and PPO's actor ``cls(loss_config, sampling_params)`` (the ``loss_fn`` keys without ``name``), distillation the
same with its keys, DPO ``cls(dpo_loss_config)``, SFT and RM ``cls()``, PPO's critic ``cls(value_loss_config)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nemo_rl_clone.algorithms.loss.configs import ClippedPGLossConfig
from nemo_rl_clone.algorithms.loss.distillation import DistillationLossConfig
from nemo_rl_clone.contract.loss import LossFunction
from nemo_rl_clone.utils.registry import Registry

LOSSES: Registry[Any] = Registry("loss", "loss_fn.name")
_PACKAGE = "nemo_rl_clone.algorithms"
for _name, _target in {
    "clipped_pg": f"{_PACKAGE}.loss.loss_functions:ClippedPGLossFn",
    "distillation": f"{_PACKAGE}.loss.distillation:DistillationLossFn",
    "nll": f"{_PACKAGE}.loss.supervised:NLLLossFn",
    "dpo": f"{_PACKAGE}.loss.supervised:DPOLossFn",
    "preference": f"{_PACKAGE}.loss.supervised:PreferenceLossFn",
    "mse_value": f"{_PACKAGE}.ppo.value_loss:MseValueLossFn",
}.items():
    LOSSES.register(_name, _target)


def build_loss(name: str | None, default: str, *args: Any) -> LossFunction:
    """The loss ``name`` names (None: ``default``, the algorithm's own), built as ``cls(*args)``."""
    loss: LossFunction = LOSSES.resolve(name or default)(*args)
    return loss


def name_problems(name: str | None) -> list[tuple[str, str]]:
    """``loss_fn.name``'s problem as a section check's ``("name", message)``; imports nothing."""
    problem = LOSSES.problem(name) if name else None
    return [("name", problem.partition(": ")[2])] if problem else []


def without_name(section: Any, schema: type) -> Any:
    """The loss's own config: ``section``'s keys of ``schema`` (``name`` is the section's, not the loss's)."""
    return schema(**{field.name: getattr(section, field.name) for field in dataclasses.fields(schema)})


@dataclasses.dataclass(frozen=True)
class ClippedPGLossSection(ClippedPGLossConfig):
    """GRPO's and PPO's ``loss_fn``: NeMo-RL's keys, and ``name`` (ours: see the module doc)."""

    name: str | None = None

    def check(self) -> list[tuple[str, str]]:
        return super().check() + name_problems(self.name)

    def loss_config(self) -> ClippedPGLossConfig:
        config: ClippedPGLossConfig = without_name(self, ClippedPGLossConfig)
        return config


@dataclasses.dataclass(frozen=True)
class DistillationLossSection(DistillationLossConfig):
    """Distillation's ``loss_fn``: NeMo-RL's keys, and ``name`` (ours: see the module doc)."""

    name: str | None = None

    def check(self) -> list[tuple[str, str]]:
        return super().check() + name_problems(self.name)

    def loss_config(self) -> DistillationLossConfig:
        config: DistillationLossConfig = without_name(self, DistillationLossConfig)
        return config
