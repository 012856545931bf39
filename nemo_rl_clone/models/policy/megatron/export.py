"""A Megatron-backend checkpoint (``step_N/policy/weights``) as a Hugging Face folder, in one process.

Megatron's distributed checkpoints reload at any parallel layout, so the model is rebuilt exactly the way the policy
worker builds it, at tensor and pipeline parallel size 1, loaded, and converted back to Hugging Face names. Used by
``examples/converters/convert_megatron_to_hf.py`` and by evaluation of a Megatron checkpoint.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from nemo_rl_clone.models.policy.backends import backend_spec
from nemo_rl_clone.models.policy.config import PolicyConfig
from nemo_rl_clone.models.policy.workers import worker_setup
from nemo_rl_clone.utils.config_validation import ConfigError, validate_config

# What Megatron's dist_checkpointing writes into every checkpoint folder (a DCP folder has only ``.metadata``).
MEGATRON_CHECKPOINT_MARKER = "metadata.json"


def is_megatron_run(policy_section: dict[str, Any]) -> bool:
    """Whether a run's saved ``policy`` section wrote Megatron distributed checkpoints."""
    return backend_spec(policy_section).checkpoint_format == "megatron_dist"


def single_process_policy(policy_section: dict[str, Any], where: str) -> PolicyConfig:
    """A run's validated policy config, re-laid out for one process: TP = PP = EP = ETP = 1 (the checkpoint
    reshards, experts included), no CUDA-stream overlaps (refused without CUDA, and nothing to overlap here).
    ``where`` prefixes errors."""
    if not is_megatron_run(policy_section):
        raise ConfigError(
            [
                f"{where}: policy.megatron_cfg.enabled is not true: this run used the "
                f"{backend_spec(policy_section).title} backend; convert "
                "its checkpoint with examples/converters/convert_dcp_to_hf.py"
            ]
        )
    megatron = {
        **policy_section["megatron_cfg"],
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "expert_model_parallel_size": 1,
        "expert_tensor_parallel_size": 1,
        "num_layers_in_first_pipeline_stage": None,
        "num_layers_in_last_pipeline_stage": None,
    }
    ddp = dict(megatron.get("distributed_data_parallel_config") or {})
    ddp.update(overlap_grad_reduce=False, overlap_param_gather=False)
    megatron["distributed_data_parallel_config"] = ddp
    try:
        return validate_config({**policy_section, "megatron_cfg": megatron}, PolicyConfig)
    except ConfigError as err:
        raise ConfigError([f"{where}: policy.{problem}" for problem in err.problems]) from None


def export_megatron_checkpoint(
    policy: PolicyConfig,
    weights_path: Path,
    out_dir: Path,
    tokenizer_path: str,
    save_format: str = "safetensors",
    dtype: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``out_dir`` from the Megatron weights at ``weights_path``. Joins (and leaves) a one-process group:
    call it in a process that has none (`export_in_subprocess` from one that should stay clean)."""
    if not (weights_path / MEGATRON_CHECKPOINT_MARKER).is_file():
        raise FileNotFoundError(
            f"{weights_path} is not a Megatron distributed checkpoint (no {MEGATRON_CHECKPOINT_MARKER}); "
            "expected step_N/policy/weights of a megatron_cfg run (DTensor checkpoints: convert_dcp_to_hf.py)"
        )
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise FileExistsError(f"{out_dir} exists and is not empty; pass --overwrite to replace it")
    # Imported here: Megatron Core is only needed once the inputs are known to be usable.
    from nemo_rl_clone.models.hf_export import save_consolidated_hf
    from nemo_rl_clone.models.huggingface import load_tokenizer, resolve_model_path
    from nemo_rl_clone.models.policy.megatron.model import gather_hf_state_dict
    from nemo_rl_clone.models.policy.megatron.policy_worker import MegatronPolicyWorker

    tokenizer = load_tokenizer(tokenizer_path)
    worker_setup.set_single_process_env()
    worker = MegatronPolicyWorker(
        policy,
        tokenizer,
        resolve_model_path(policy.model_name),
        weights_path=str(weights_path),
        init_optimizer=False,
        init_reference_model=False,
    )
    try:
        state_dict = gather_hf_state_dict(worker.model, worker.shape, worker.layers)
        assert state_dict is not None  # rank 0 of a world of 1
        return save_consolidated_hf(
            state_dict,
            worker.hf_config,
            out_dir,
            tokenizer=tokenizer,
            dtype=dtype,
            overwrite=overwrite,
            save_format=save_format,
        )
    finally:
        worker.shutdown()


def export_in_subprocess(*args: Any, **kwargs: Any) -> Path:
    """`export_megatron_checkpoint` in a fresh spawned process, so that the caller's process never holds a process
    group or Megatron's global parallel state (an evaluation driver, for one)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(export_megatron_checkpoint, *args, **kwargs).result()
