"""NeMo-RL v0.7.0's names its scripts import from ``nemo_rl.algorithms.grpo`` beside setup and the train functions
(its NeMo-Gym example imports them all), ``grpo_sync.grpo_train_sync``, ``get_actor_python_env`` and the vLLM
``VllmConfig``: what each one does here. The real refit through NeMo-RL's ``refit_policy_generation`` is in
tests/unit/test_vllm_refit.py (engine logprobs equal the trainer's after the weights change)."""

from __future__ import annotations

import dataclasses
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from nemo_rl_clone.algorithms import grpo
from nemo_rl_clone.distributed import ray_actor_environment as actor_envs
from nemo_rl_clone.distributed.ray_actor_environment_registry import get_actor_python_env
from nemo_rl_clone.environments.config import EnvConfig
from nemo_rl_clone.models.generation import configure_generation_config
from nemo_rl_clone.models.generation.config import GenerationConfig
from nemo_rl_clone.models.generation.vllm import VllmConfig
from nemo_rl_clone.utils.config_validation import ConfigError, as_config, validate_config
from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.utils.timer import Timer

REPO = Path(__file__).resolve().parents[2]


def test_the_type_names_are_the_classes_setup_returns() -> None:
    from nemo_rl_clone.data.dataloader import StatefulPromptLoader
    from nemo_rl_clone.environments.math_environment import MathEnvironment
    from nemo_rl_clone.models.generation.vllm import VllmGeneration
    from nemo_rl_clone.models.policy.lm_policy import Policy
    from nemo_rl_clone.utils.logger import Logger

    assert isinstance(grpo.TokenizerType, typing.TypeVar)
    assert grpo.TokenizerType.__bound__ is PreTrainedTokenizerBase
    assert issubclass(Policy, grpo.ColocatablePolicyInterface)
    assert issubclass(VllmGeneration, grpo.GenerationInterface)
    assert issubclass(MathEnvironment.__ray_actor_class__, grpo.EnvironmentInterface)
    assert grpo.Logger is Logger and grpo.StatefulDataLoader is StatefulPromptLoader


def test_the_stateful_dataloader_resumes_at_the_next_batch() -> None:
    def load() -> Any:
        return grpo.StatefulDataLoader(list(range(10)), batch_size=3, collate_fn=list, shuffle=True, seed=5)

    loader = load()
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()
    expected = next(batches)
    resumed = load()
    resumed.load_state_dict(state)
    assert next(iter(resumed)) == expected


NEMO_GYM_ASKED = {"env": {"should_use_nemo_gym": True}}


def with_vllm_cfg(**vllm_cfg: bool) -> dict[str, Any]:
    return {**NEMO_GYM_ASKED, "policy": {"generation": {"backend": "vllm", "vllm_cfg": vllm_cfg}}}


def test_should_use_nemo_gym_answers_as_nemo_rl() -> None:
    assert grpo._should_use_nemo_gym({"env": {}}) is False
    assert grpo._should_use_nemo_gym({"env": {"should_use_nemo_gym": False}}) is False
    assert grpo._should_use_nemo_gym(grpo.MasterConfig()) is False
    assert grpo._should_use_nemo_gym(grpo.MasterConfig(env={"math": {}})) is False  # NeMo-RL's dict sections
    assert grpo._should_use_nemo_gym(with_vllm_cfg(async_engine=True, expose_http_server=True)) is True
    for missing in ("async_engine", "expose_http_server"):
        cfg = {"async_engine": True, "expose_http_server": True, missing: False}
        with pytest.raises(UserInputError, match=rf"^policy.generation.vllm_cfg.{missing}: must be true"):
            grpo._should_use_nemo_gym(with_vllm_cfg(**cfg))


@dataclasses.dataclass
class Sections:
    """A config with an ``env`` section, as every rollout algorithm's master config has."""

    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)


def test_a_config_asking_for_nemo_gym_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"env.should_use_nemo_gym: not supported yet: NeMo-Gym environments"):
        validate_config(NEMO_GYM_ASKED, Sections)


class Recorder:
    """A colocated policy and engine pair that records the refit's calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.loaded: dict[str, torch.Tensor] = {}

    def offload_before_refit(self) -> None:
        self.calls.append("policy.offload_before_refit")

    def offload_after_refit(self) -> None:
        self.calls.append("policy.offload_after_refit")

    def get_full_state_dict_for_refit(self) -> dict[str, torch.Tensor]:
        return {"w": torch.ones(2)}

    def prepare_for_generation(self, tags: list[str] | None = None) -> None:
        self.calls.append(f"generation.prepare_for_generation({tags})")

    def update_weights_from_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.calls.append("generation.update_weights")
        self.loaded = dict(state_dict)


def test_refit_policy_generation_takes_nemo_rl_arguments_and_times_under_its_label() -> None:
    pair, timer = Recorder(), Timer()
    assert grpo.refit_policy_generation(pair, typing.cast(Any, pair), True, None, timer) is None
    assert pair.calls == [
        "policy.offload_before_refit",
        "generation.prepare_for_generation(['weights'])",
        "generation.update_weights",
        "policy.offload_after_refit",
        "generation.prepare_for_generation(['kv_cache'])",
    ]
    assert torch.equal(pair.loaded["w"], torch.ones(2))
    assert list(timer.get_timing_metrics("sum")) == ["prepare_for_generation/transfer_and_update_weights"]


def test_refit_policy_generation_refuses_fp8_kv_scales_and_a_bad_buffer_size() -> None:
    pair = Recorder()
    with pytest.raises(UserInputError, match=r"^kv_scales: not supported yet: FP8 KV-cache scales"):
        grpo.refit_policy_generation(pair, typing.cast(Any, pair), True, kv_scales={"k_scale": 1.0})
    with pytest.raises(UserInputError, match=r"^_refit_buffer_size_gb: must be > 0, got 0"):
        grpo.refit_policy_generation(pair, typing.cast(Any, pair), False, _refit_buffer_size_gb=0)
    assert pair.calls == []


def test_grpo_train_sync_takes_only_a_policy_on_the_data_plane() -> None:
    """NeMo-RL's run_grpo.py hands grpo_train_sync the TQPolicy its policy factory built (the run itself:
    test_nemo_rl_entry_scripts.py); a plain policy is named in one line, and validate_sync (NeMo-RL's validation
    through a rollout actor) is refused by name."""
    from nemo_rl_clone.algorithms import grpo_sync

    with pytest.raises(UserInputError, match=r"^grpo_train_sync: the policy is a object, not a TQPolicy"):
        grpo_sync.grpo_train_sync(*([object()] * 12))
    with pytest.raises(ImportError, match="validate_sync: not supported yet: validation through a rollout actor"):
        grpo_sync.validate_sync  # noqa: B018


def test_get_actor_python_env_returns_each_actor_class_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(actor_envs, "_ACTOR_ENVIRONMENTS", {})
    monkeypatch.setattr(actor_envs, "ensure_uv_environment", lambda *_: pytest.fail("a lookup builds nothing"))
    # Unregistered (NeMo-RL raises there): the driver's interpreter, NeMo-RL's PY_EXECUTABLES.SYSTEM.
    assert get_actor_python_env("nemo_rl_clone.environments.math_environment.MathEnvironment") == sys.executable
    actor_envs.register_actor_environment("pkg.mod.Explicit", "/opt/py/bin/python")
    assert get_actor_python_env("pkg.mod.Explicit") == "/opt/py/bin/python"
    actor_envs.register_actor_environment("pkg.mod.Gpu", actor_envs.PY_EXECUTABLES.VLLM)
    assert get_actor_python_env("pkg.mod.Gpu") == str(REPO / "venvs" / "vllm" / "bin" / "python")


def test_vllm_config_is_nemo_rl_dict_form_of_the_generation_section() -> None:
    from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer

    config = VllmConfig(backend="vllm", max_new_tokens=100, temperature=0.7, top_p=1, top_k=None, vllm_cfg={})
    config["vllm_cfg"]["max_model_len"] = 2048
    assert type(config) is dict and config["max_new_tokens"] == 100
    config = configure_generation_config(config, load_tokenizer(TINY_LLAMA))
    validated = as_config(config, GenerationConfig, key="policy.generation")
    assert validated.vllm_cfg.max_model_len == 2048 and validated.stop_token_ids == config["stop_token_ids"]
    with pytest.raises(ConfigError, match=r"policy.generation.real_quant: not supported yet"):
        as_config(VllmConfig(real_quant=True), GenerationConfig, key="policy.generation")
