"""`build_generation` builds the backend ``generation.backend`` names from `GENERATION_BACKENDS`, and config
validation refuses, naming the registered ones, any other backend."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from nemo_rl_clone.models.generation.config import ColocatedConfig, GenerationConfig
from nemo_rl_clone.models.generation.factory import GENERATION_BACKENDS, build_generation


class _Recorder:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs


@pytest.fixture
def registered() -> Iterator[None]:
    """Backend "hf" registered as `_Recorder` (no engine starts) while the test runs."""
    GENERATION_BACKENDS.register("hf", _Recorder)
    yield
    GENERATION_BACKENDS.unregister("hf")


def test_vllm_is_the_registered_default() -> None:
    assert GENERATION_BACKENDS.names() == ["megatron", "vllm"]
    assert GENERATION_BACKENDS.resolve("vllm").__name__ == "VllmGeneration"
    assert GENERATION_BACKENDS.resolve("megatron").__name__ == "MegatronGeneration"
    assert GenerationConfig().backend == "vllm"


def test_megatron_generation_is_built_from_the_policy_and_refused_without_one() -> None:
    from types import SimpleNamespace

    from nemo_rl_clone.utils.unsupported_modules import UnsupportedFeatureError

    config = GenerationConfig(backend="megatron")
    policy = SimpleNamespace(dp_size=3)
    built = build_generation("cluster", config, "model", policy=policy)  # type: ignore[arg-type]
    assert built.policy is policy and built.dp_size == 3  # type: ignore[attr-defined]
    with pytest.raises(UnsupportedFeatureError, match="a Megatron generation cluster of its own"):
        build_generation("cluster", config, "model")  # type: ignore[arg-type]
    stand_alone = GenerationConfig(backend="megatron", colocated=ColocatedConfig(enabled=False), stop_strings=["x"])
    problems = dict(stand_alone.check())
    assert problems["colocated.enabled"].startswith("not supported yet with backend megatron")
    assert problems["stop_strings"].startswith("not supported yet with backend megatron")


def test_builds_the_configured_backend_with_the_callers_arguments(registered: None) -> None:
    config = GenerationConfig(backend="hf")
    built = build_generation("cluster", config, "model", seed=3, env_vars={"A": "1"})  # type: ignore[arg-type]
    assert isinstance(built, _Recorder)
    assert built.args == ("cluster", config, "model")
    # No name_prefix: the backend keeps its own default (vLLM's actors are named vllm_policy-<rank>).
    assert built.kwargs == {
        "seed": 3,
        "env_vars": {"A": "1"},
        "weight_updates_during_generation": False,
        "hf_config_overrides": None,
    }
    named = build_generation("cluster", config, "model", name_prefix="vllm_eval")  # type: ignore[arg-type]
    assert isinstance(named, _Recorder) and named.kwargs["name_prefix"] == "vllm_eval"


def test_validation_names_the_registered_backends() -> None:
    assert ("backend", "the 'hf' generation backend is not supported yet; use 'megatron' or 'vllm'") in (
        GenerationConfig(backend="hf").check()
    )
    assert not [key for key, _ in GenerationConfig(backend="megatron").check() if key == "backend"]
    GENERATION_BACKENDS.register("sglang", "some.module:SglangGeneration")
    try:
        assert not [key for key, _ in GenerationConfig(backend="sglang").check() if key == "backend"]
        problems = dict(GenerationConfig(backend="hf").check())
        assert (
            problems["backend"]
            == "the 'hf' generation backend is not supported yet; use 'megatron', 'sglang' or 'vllm'"
        )
    finally:
        GENERATION_BACKENDS.unregister("sglang")
    # Any other value: a registered name or an import path, named in one line.
    assert not [key for key, _ in GenerationConfig(backend="my_pkg.engines:MyGeneration").check() if key == "backend"]
    assert dict(GenerationConfig(backend="vlm").check())["backend"].startswith(
        "unknown generation backend 'vlm' (did you mean 'vllm'?)"
    )
