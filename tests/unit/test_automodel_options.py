"""NeMo Automodel's ``policy.dtensor_cfg.automodel_kwargs``: which options validate (those naming what the Hugging
Face implementation run here already does), the one line each refused option gets, and ``freeze_config`` on a
real Hugging Face vision-language model's module tree."""

from __future__ import annotations

import pytest
import torch
from transformers import CLIPVisionConfig, LlamaConfig, LlamaForCausalLM, LlavaConfig, LlavaForConditionalGeneration

from nemo_rl_clone.models.policy.config import PolicyConfig
from nemo_rl_clone.models.policy.dtensor import automodel_options
from nemo_rl_clone.utils.config_validation import ConfigError, validate_config

HONOURED = {
    "force_hf": True,
    "attn_implementation": "eager",
    "use_liger_kernel": False,
    "use_sdpa_patching": False,
    "freeze_config": {"freeze_vision_tower": True, "freeze_audio_tower": True, "freeze_language_model": False},
    "backend": {
        "_target_": automodel_options.BACKEND_TARGET,
        "attn": "sdpa",
        "linear": "torch",
        "rms_norm": "torch_fp32",
        "experts": "torch",
        "dispatcher": "torch",
        "enable_deepep": False,
        "fake_balanced_gate": False,
        "enable_hf_state_dict_adapter": True,
        "rope_fusion": False,
        "enable_fsdp_optimizations": False,
    },
}


def policy_problems(automodel_kwargs: dict, **dtensor_cfg: object) -> list[str]:
    section = {"model_name": "m", "dtensor_cfg": {"automodel_kwargs": automodel_kwargs, **dtensor_cfg}}
    try:
        validate_config(section, PolicyConfig)
    except ConfigError as err:
        return err.problems
    return []


def test_options_naming_the_hugging_face_implementation_validate() -> None:
    assert automodel_options.check(HONOURED) == []
    assert policy_problems(HONOURED) == []


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"backend": {"attn": "te"}}, "backend.attn"),
        ({"backend": {"experts": "gmm"}}, "backend.experts"),
        ({"backend": {"dispatcher": "deepep"}}, "backend.dispatcher"),
        ({"backend": {"enable_deepep": True}}, "backend.enable_deepep"),
        ({"backend": {"gate_precision": "float64"}}, "backend.gate_precision"),
        ({"backend": {"_target_": "my.Backend"}}, "backend._target_"),
        ({"use_liger_kernel": True}, "use_liger_kernel"),
        ({"force_hf": False}, "force_hf"),
        ({"attn_implementation": "flash_attention_2"}, "attn_implementation"),
        ({"freeze_config": {"freeze_embeddings": True}}, "freeze_config.freeze_embeddings"),
        ({"trust_remote_code": True}, "trust_remote_code"),
    ],
)
def test_each_option_asking_for_another_kernel_is_one_line_naming_it(options: dict, key: str) -> None:
    problems = policy_problems(options)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"dtensor_cfg.automodel_kwargs.{key}: not supported yet"), problems


def test_attention_comes_from_automodel_kwargs_and_may_not_contradict_ours() -> None:
    assert automodel_options.hf_attention({"attn_implementation": "eager"}, "sdpa") == "eager"
    assert automodel_options.hf_attention({}, "eager") == "eager"
    assert policy_problems({"attn_implementation": "sdpa"}, attn_implementation="eager") == [
        "dtensor_cfg.automodel_kwargs.attn_implementation: 'sdpa' disagrees with dtensor_cfg.attn_implementation "
        "'eager'; set one of them"
    ]


def tiny_llava() -> LlavaForConditionalGeneration:
    vision = CLIPVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=8, patch_size=4
    )
    text = LlamaConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=64,
    )
    return LlavaForConditionalGeneration(LlavaConfig(vision_config=vision, text_config=text))


def trainable(model: torch.nn.Module, prefix: str) -> set[bool]:
    return {p.requires_grad for name, p in model.named_parameters() if name.startswith(prefix)}


def test_freeze_config_freezes_the_named_towers_of_a_vision_language_model() -> None:
    model = tiny_llava()
    vision = sum(p.numel() for p in model.model.vision_tower.parameters())
    language = sum(p.numel() for p in model.model.language_model.parameters())
    # Automodel's default freezes the vision tower; the language model and projector stay trainable.
    frozen = automodel_options.freeze(model, {})
    assert frozen == {"freeze_vision_tower": vision}
    assert trainable(model, "model.vision_tower.") == {False}
    assert trainable(model, "model.language_model.") == {True}
    assert trainable(model, "model.multi_modal_projector.") == {True}
    assert trainable(model, "lm_head.") == {True}

    model = tiny_llava()
    frozen = automodel_options.freeze(model, {"freeze_vision_tower": False, "freeze_language_model": True})
    assert frozen == {"freeze_language_model": language}
    assert trainable(model, "model.vision_tower.") == {True}
    assert trainable(model, "model.language_model.") == {False}


def test_a_part_the_model_lacks_is_said_and_nothing_else_changes(capsys: pytest.CaptureFixture[str]) -> None:
    config = LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=64
    )
    model = LlamaForCausalLM(config)
    assert automodel_options.freeze(model, {"freeze_audio_tower": True}) == {
        "freeze_vision_tower": 0,
        "freeze_audio_tower": 0,
    }
    assert trainable(model, "") == {True}
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "dtensor_cfg.automodel_kwargs.freeze_config.freeze_vision_tower",
        "dtensor_cfg.automodel_kwargs.freeze_config.freeze_audio_tower",
    ]
    assert automodel_options.freeze(model, None) == {}
