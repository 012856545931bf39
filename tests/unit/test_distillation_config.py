"""`DistillationMasterConfig`: the shipped recipes validate, NeMo-RL's keys are accepted, and every impossible
combination is one line naming its key."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from nemo_rl_clone.algorithms.distillation.config import DistillationMasterConfig
from nemo_rl_clone.algorithms.distillation.train import check_vocab_equality, check_vocab_match
from nemo_rl_clone.algorithms.run.preflight import preflight
from nemo_rl_clone.models.huggingface import BUILTIN_MODELS, SMOLLM2, TINY_LLAMA, load_tokenizer, resolve_model_path
from nemo_rl_clone.utils.config import load_validated_config
from nemo_rl_clone.utils.config_validation import ConfigError
from nemo_rl_clone.utils.errors import UserInputError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def load(*overrides: str, name: str = "distillation_smoke.yaml") -> DistillationMasterConfig:
    return load_validated_config(CONFIGS / name, list(overrides), DistillationMasterConfig)


def problems(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as error:
        load(*overrides)
    return error.value.problems


def test_shipped_recipes_validate() -> None:
    gpu = load(name="distillation_math.yaml")
    assert (gpu.policy.model_name, gpu.teacher.model_name) == ("Qwen/Qwen3-1.7B-Base", "Qwen/Qwen3-4B")
    assert gpu.teacher.dtensor_cfg.tensor_parallel_size == 4 and gpu.policy.dtensor_cfg.tensor_parallel_size == 2
    assert gpu.teacher.train_global_batch_size == gpu.policy.train_global_batch_size  # copied by the YAML anchor
    assert (gpu.loss_fn.kl_type, gpu.loss_fn.mixed_kl_weight, gpu.distillation.topk_logits_k) == ("mixed", 0.5, 64)
    smoke = load()
    assert (smoke.policy.model_name, smoke.teacher.model_name) == ("tiny-random-llama", "SmolLM2-135M-Instruct")


def test_the_loop_section_is_the_student_run() -> None:
    config = load("distillation.num_generations_per_prompt=2", "policy.train_global_batch_size=16")
    assert config.loop is config.distillation
    assert (config.loop.num_prompts_per_step, config.loop.num_generations_per_prompt) == (8, 2)
    assert not config.needs_reference_model  # no reference model is built for the student
    assert config.check() == []


def test_impossible_combinations_name_their_keys() -> None:
    assert problems("distillation.topk_logits_k=0") == ["distillation.topk_logits_k: must be >= 1, got 0"]
    assert problems("loss_fn.mixed_kl_weight=2") == [
        "loss_fn.mixed_kl_weight: must be in [0, 1] (weight of the forward KL), got 2.0"
    ]
    (line,) = problems("loss_fn.kl_type=jensen")
    assert line.startswith("loss_fn.kl_type: ")
    assert problems("policy.train_global_batch_size=16", "policy.train_micro_batch_size=4") == [
        "policy.train_global_batch_size: must divide distillation.num_prompts_per_step * "
        "distillation.num_generations_per_prompt = 8 (got 16)"
    ]
    assert problems("teacher.max_total_sequence_length=64") == [
        "teacher.max_total_sequence_length: must be >= policy.max_total_sequence_length: the teacher scores the "
        "student's whole samples (64 < 128)"
    ]
    (line,) = problems("+distillation.num_prompts_per_stepp=4")
    assert line.startswith(
        "distillation.num_prompts_per_stepp: unknown key (did you mean distillation.num_prompts_per_step?"
    )


def test_megatron_models_validate_and_the_fused_linear_ce_is_refused_in_one_line() -> None:
    megatron = ("+teacher.megatron_cfg.enabled=true", "teacher.dtensor_cfg.enabled=false")
    config = load(*megatron, "teacher.optimizer=null", "teacher.scheduler=null")
    assert config.teacher.megatron_cfg.enabled  # its top-k: tests/unit/test_megatron_policy.py
    fused = ("+teacher.megatron_cfg.use_linear_ce_fusion_loss=true", "teacher.optimizer=null", "teacher.scheduler=null")
    assert problems(*megatron, *fused) == [
        "teacher.megatron_cfg.use_linear_ce_fusion_loss: not supported yet with distillation's KL loss, which reads "
        "whole logits (as in NeMo-RL, it serves SFT and DPO); set it to false"
    ]


def test_vocab_check_needs_the_same_token_ids_and_logits_width(tmp_path: Path) -> None:
    student = load_tokenizer(TINY_LLAMA)
    check_vocab_equality(student, TINY_LLAMA, SMOLLM2)  # the smoke run's pair: SmolLM2's tokenizer on both sides
    check_vocab_match(load())

    extended = load_tokenizer(TINY_LLAMA)
    extended.add_tokens(["<not_in_the_teacher>"])
    with pytest.raises(UserInputError, match=r"teacher.model_name: 'SmolLM2-135M-Instruct' has a tokenizer whose"):
        check_vocab_equality(extended, TINY_LLAMA, SMOLLM2)

    wider = tmp_path / "wider"
    shutil.copytree(resolve_model_path(TINY_LLAMA), wider)
    config = json.loads((wider / "config.json").read_text())
    (wider / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 64}))
    with pytest.raises(
        UserInputError, match=r"the teacher's vocab_size \(49216\) differs from the student's \(49152\)"
    ):
        check_vocab_equality(student, TINY_LLAMA, str(wider))


def test_preflight_checks_the_teacher_model_and_its_parallel_size(tmp_path: Path) -> None:
    dirs = (f"logger.log_dir={tmp_path / 'logs'}", f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}")
    preflight(load(*dirs))
    with pytest.raises(UserInputError) as error:
        preflight(
            load(*dirs, f"teacher.model_name={tmp_path / 'missing'}", "teacher.dtensor_cfg.tensor_parallel_size=2")
        )
    assert error.value.problems == [
        f"teacher.model_name: model folder '{tmp_path / 'missing'}' does not exist (a local model folder or a built-in "
        f"model: {', '.join(BUILTIN_MODELS)}, HuggingFaceTB/SmolLM2-135M-Instruct)",
        "teacher.dtensor_cfg.tensor_parallel_size: 2 must divide the 1 workers of cluster.*",
    ]
