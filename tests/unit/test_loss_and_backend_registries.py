"""``loss_fn.name`` and ``policy.backend``: a plug-in by registry name or import path, checked at validation
without importing it, built in one place (`build_loss`, `backend_spec`)."""

from __future__ import annotations

from typing import Any

import pytest

from nemo_rl_clone.algorithms.distillation.config import DistillationMasterConfig
from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
from nemo_rl_clone.algorithms.loss import ClippedPGLossConfig, ClippedPGLossFn, DistillationLossFn
from nemo_rl_clone.algorithms.loss.distillation import DistillationLossConfig
from nemo_rl_clone.algorithms.loss.registry import build_loss
from nemo_rl_clone.algorithms.ppo.config import PPOMasterConfig
from nemo_rl_clone.models.policy.backend_checks import capability_problems
from nemo_rl_clone.models.policy.backends import backend_key, backend_spec, policy_backend
from nemo_rl_clone.models.policy.config import PolicyConfig
from nemo_rl_clone.utils.config_validation import ConfigError, validate_config
from nemo_rl_clone.utils.errors import UserInputError


class RecordingLoss:
    """A user's GRPO loss: built with GRPO's arguments (the ``loss_fn`` keys, the sampling parameters)."""

    def __init__(self, cfg: Any, sampling_params: Any) -> None:
        self.cfg, self.sampling_params = cfg, sampling_params


LOSS_PATH = f"{__name__}:RecordingLoss"


def test_a_loss_named_by_import_path_is_the_one_built() -> None:
    config = validate_config({"loss_fn": {"name": LOSS_PATH, "ratio_clip_max": 0.28}}, GRPOMasterConfig)
    loss = build_loss(config.loss_fn.name, "clipped_pg", config.loss_fn.loss_config(), "sampling")
    assert isinstance(loss, RecordingLoss) and loss.sampling_params == "sampling"
    # The loss gets NeMo-RL's section, without ``name``.
    assert type(loss.cfg) is ClippedPGLossConfig and loss.cfg.ratio_clip_max == 0.28


def test_absent_name_builds_the_algorithms_own_loss() -> None:
    grpo = validate_config({}, GRPOMasterConfig)
    assert isinstance(build_loss(grpo.loss_fn.name, "clipped_pg", grpo.loss_fn.loss_config(), None), ClippedPGLossFn)
    distillation = DistillationMasterConfig()  # its section as validation builds it
    loss = build_loss(distillation.loss_fn.name, "distillation", distillation.loss_fn.loss_config(), None)
    assert isinstance(loss, DistillationLossFn) and type(loss.cfg) is DistillationLossConfig


@pytest.mark.parametrize("schema", [GRPOMasterConfig, PPOMasterConfig, DistillationMasterConfig])
def test_a_bad_loss_name_is_one_line_naming_loss_fn_name(schema: type) -> None:
    with pytest.raises(ConfigError) as error:
        validate_config({"loss_fn": {"name": "clipped"}}, schema)
    assert [p for p in error.value.problems if "loss_fn" in p] == [
        "loss_fn.name: unknown loss 'clipped' (did you mean 'clipped_pg'?); registered: clipped_pg, distillation, "
        "dpo, mse_value, nll, preference, or an import path 'package.module:attribute'"
    ]
    with pytest.raises(UserInputError, match=r"^loss_fn.name: cannot import module 'no_such_pkg'"):
        build_loss("no_such_pkg:Loss", "clipped_pg")


def test_the_backend_is_derived_from_nemo_rl_switches_unless_named() -> None:
    megatron = {"dtensor_cfg": {"enabled": False}, "megatron_cfg": {"enabled": True}, "optimizer": None}
    assert policy_backend(PolicyConfig()) == policy_backend({}) == "dtensor"
    assert policy_backend(validate_config(megatron, PolicyConfig)) == policy_backend(megatron) == "megatron"
    named = validate_config({"backend": "tests.unit.policy_backend_plugin:PLUGIN_BACKEND"}, PolicyConfig)
    assert backend_key(named) == "backend" and backend_spec(named).title == "Plugin"
    with pytest.raises(ConfigError) as error:
        validate_config({"backend": "megatorn"}, PolicyConfig)
    assert error.value.problems == [
        "backend: unknown policy backend 'megatorn' (did you mean 'megatron'?); registered: dtensor, megatron, or "
        "an import path 'package.module:attribute'"
    ]


def test_an_imported_backends_capability_table_is_checked_when_the_policy_builds() -> None:
    # Validation does not import the plug-in; `Policy` refuses what its table lacks (no sequence packing).
    packing = {"enabled": True, "train_mb_tokens": 1024}
    config = validate_config(
        {"backend": "tests.unit.policy_backend_plugin:PLUGIN_BACKEND", "sequence_packing": packing}, PolicyConfig
    )
    assert capability_problems(config, backend_spec(config)) == [
        (
            "sequence_packing.enabled",
            "not supported yet: sequence packing with the Plugin backend (the DTensor backend packs); with "
            "dtensor_cfg use policy.dynamic_batching to cut padding",
        )
    ]


def test_estimators_and_environments_are_registries() -> None:
    from nemo_rl_clone.algorithms.advantage_estimator import (
        GRPOAdvantageEstimator,
        RLOOAdvantageEstimator,
        estimator_class,
    )
    from nemo_rl_clone.environments import ENVIRONMENT_REGISTRY, register_env

    module = "nemo_rl_clone.algorithms.advantage_estimator"
    assert estimator_class("grpo") is GRPOAdvantageEstimator
    assert estimator_class(f"{module}:RLOOAdvantageEstimator") is estimator_class(f"{module}.RLOOAdvantageEstimator")
    assert estimator_class(f"{module}.RLOOAdvantageEstimator") is RLOOAdvantageEstimator
    assert {"math", "code", "agent"} <= set(ENVIRONMENT_REGISTRY.names())
    register_env("math", "nemo_rl_clone.environments.math_environment.MathEnvironment")  # the same class: accepted
    with pytest.raises(ValueError, match="'math' is already registered"):
        register_env("math", "my_pkg.envs.OtherMath")
