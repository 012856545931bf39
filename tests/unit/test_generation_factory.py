"""`build_generation` builds the backend ``generation.backend`` names from `GENERATION_BACKENDS`, and config
validation refuses, naming the registered ones, any other backend."""

from __future__ import annotations

from typing import Any

import pytest

from nemo_rl_clone.models.generation import factory
from nemo_rl_clone.models.generation.config import GenerationConfig
from nemo_rl_clone.models.generation.factory import GENERATION_BACKENDS, build_generation


class _Recorder:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs


@pytest.fixture
def imported(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths the factory imports; each resolves to `_Recorder` (no engine starts)."""
    paths: list[str] = []

    def import_by_path(path: str) -> type:
        paths.append(path)
        return _Recorder

    monkeypatch.setattr(factory, "import_by_path", import_by_path)
    return paths


def test_vllm_is_the_registered_default() -> None:
    assert GENERATION_BACKENDS == {"vllm": "nemo_rl_clone.models.generation.vllm.vllm_generation.VllmGeneration"}
    assert GenerationConfig().backend == "vllm"


def test_builds_the_configured_backend_with_the_callers_arguments(
    imported: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(GENERATION_BACKENDS, "hf", "some.module.HfGeneration")
    config = GenerationConfig(backend="hf")
    built = build_generation("cluster", config, "model", seed=3, env_vars={"A": "1"})  # type: ignore[arg-type]
    assert imported == ["some.module.HfGeneration"]
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


def test_validation_names_the_registered_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ("backend", "the 'hf' generation backend is not supported yet; use 'vllm'") in GenerationConfig(
        backend="hf"
    ).check()
    monkeypatch.setitem(GENERATION_BACKENDS, "sglang", "some.module.SglangGeneration")
    assert not [key for key, _ in GenerationConfig(backend="sglang").check() if key == "backend"]
    problems = dict(GenerationConfig(backend="megatron").check())
    assert problems["backend"] == "the 'megatron' generation backend is not supported yet; use 'vllm' or 'sglang'"
