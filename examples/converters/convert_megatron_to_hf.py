"""Convert a training checkpoint's Megatron weights into a Hugging Face folder (transformers and vLLM load it).

    uv run examples/converters/convert_megatron_to_hf.py --config results/grpo/step_50/config.yaml \\
        --megatron-ckpt-path results/grpo/step_50/policy/weights --hf-ckpt-path results/grpo/hf_step_50

For runs with ``policy.megatron_cfg.enabled: true`` (DTensor runs: ``convert_dcp_to_hf.py``). The run's
``config.yaml`` gives the policy section: ``policy.model_name`` (the architecture and config), the converter type
and the precision. The weights are Megatron Core's distributed checkpoint, which reloads at any parallel layout, so
the model is rebuilt the way the policy worker builds it, in this one process at tensor and pipeline parallel size 1
(gloo on CPU; the GPU when there is one), loaded, and converted back to Hugging Face names. The tokenizer is the one
saved with the checkpoint (``policy/tokenizer`` next to the weights) when present, else ``policy.tokenizer.name``
(or the model's). The weights are written as the run's ``checkpointing.model_save_format`` (``safetensors``, the
default, or ``torch_save``), in the checkpoint's dtype unless ``--dtype`` says otherwise.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from nemo_rl_clone.models.hf_export import save_consolidated_hf
from nemo_rl_clone.models.huggingface import load_tokenizer, resolve_model_path
from nemo_rl_clone.models.policy.config import PolicyConfig
from nemo_rl_clone.utils.config import load_config, resolve_to_container
from nemo_rl_clone.utils.config_validation import ConfigError, validate_config
from nemo_rl_clone.utils.errors import UserInputError

# What Megatron's dist_checkpointing writes into every checkpoint folder (a DCP folder has only ``.metadata``).
MEGATRON_CHECKPOINT_MARKER = "metadata.json"


def convert_megatron_to_hf(
    config_path: Path,
    megatron_ckpt_path: Path,
    hf_ckpt_path: Path,
    tokenizer_path: Path | None = None,
    dtype: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``hf_ckpt_path`` from the Megatron weights at ``megatron_ckpt_path``; see the module docstring."""
    config = resolve_to_container(load_config(config_path))
    policy_section = _policy_section(config, config_path)
    save_format = (config.get("checkpointing") or {}).get("model_save_format") or "safetensors"
    policy = _single_process_policy(policy_section, config_path)
    if not (megatron_ckpt_path / MEGATRON_CHECKPOINT_MARKER).is_file():
        raise FileNotFoundError(
            f"{megatron_ckpt_path} is not a Megatron distributed checkpoint (no {MEGATRON_CHECKPOINT_MARKER}); "
            "expected step_N/policy/weights of a megatron_cfg run (DTensor checkpoints: convert_dcp_to_hf.py)"
        )
    if hf_ckpt_path.exists() and any(hf_ckpt_path.iterdir()) and not overwrite:
        raise FileExistsError(f"{hf_ckpt_path} exists and is not empty; pass --overwrite to replace it")

    if tokenizer_path is None:
        saved = megatron_ckpt_path.parent / "tokenizer"
        tokenizer_name = policy.tokenizer.name or policy.model_name
        tokenizer_path = saved if saved.is_dir() else Path(tokenizer_name)
    tokenizer = load_tokenizer(str(tokenizer_path))

    _join_single_process_group()
    # Imported here: Megatron Core is only needed once the inputs are known to be usable.
    from nemo_rl_clone.models.megatron.model import gather_hf_state_dict
    from nemo_rl_clone.models.policy.megatron_policy_worker import MegatronPolicyWorker

    worker = MegatronPolicyWorker(
        policy,
        tokenizer,
        resolve_model_path(policy.model_name),
        weights_path=str(megatron_ckpt_path),
        init_optimizer=False,
        init_reference_model=False,
    )
    try:
        state_dict = gather_hf_state_dict(worker.model, worker.shape, worker.layers)
        assert state_dict is not None  # rank 0 of a world of 1
        return save_consolidated_hf(
            state_dict,
            worker.hf_config,
            hf_ckpt_path,
            tokenizer=tokenizer,
            dtype=dtype,
            overwrite=overwrite,
            save_format=save_format,
        )
    finally:
        worker.shutdown()


def _policy_section(config: dict[str, Any], config_path: Path) -> dict[str, Any]:
    policy = config.get("policy")
    if not isinstance(policy, dict):
        raise ConfigError([f"{config_path}: no 'policy' section (expected the config.yaml saved with the checkpoint)"])
    return policy


def _single_process_policy(policy: dict[str, Any], config_path: Path) -> PolicyConfig:
    """The run's validated policy config, re-laid out for one process: TP = PP = 1 (the checkpoint reshards), no
    CUDA-stream overlaps (they are refused without CUDA and do nothing here)."""
    megatron = policy.get("megatron_cfg")
    if not isinstance(megatron, dict) or not megatron.get("enabled"):
        raise ConfigError(
            [
                f"{config_path}: policy.megatron_cfg.enabled is not true: this run used the DTensor backend; convert "
                "its checkpoint with examples/converters/convert_dcp_to_hf.py"
            ]
        )
    megatron = {
        **megatron,
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "num_layers_in_first_pipeline_stage": None,
        "num_layers_in_last_pipeline_stage": None,
    }
    ddp = dict(megatron.get("distributed_data_parallel_config") or {})
    ddp.update(overlap_grad_reduce=False, overlap_param_gather=False)
    megatron["distributed_data_parallel_config"] = ddp
    try:
        return validate_config({**policy, "megatron_cfg": megatron}, PolicyConfig)
    except ConfigError as err:
        raise ConfigError([f"{config_path}: policy.{problem}" for problem in err.problems]) from None


def _join_single_process_group() -> None:
    """This process as rank 0 of a world of 1 (what `MegatronPolicyWorker` joins), on a free local port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="the run's config.yaml (e.g. step_N/config.yaml)")
    parser.add_argument(
        "--megatron-ckpt-path", type=Path, required=True, help="Megatron weights folder (step_N/policy/weights)"
    )
    parser.add_argument("--hf-ckpt-path", type=Path, required=True, help="output Hugging Face folder")
    parser.add_argument("--tokenizer-path", type=Path, default=None, help="default: step_N/policy/tokenizer if present")
    parser.add_argument("--dtype", default=None, help="cast weights, e.g. bfloat16 (default: keep the saved dtype)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --hf-ckpt-path")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        out = convert_megatron_to_hf(
            args.config, args.megatron_ckpt_path, args.hf_ckpt_path, args.tokenizer_path, args.dtype, args.overwrite
        )
    except ConfigError as err:
        print("\n".join(f"error: {p}" for p in err.problems), file=sys.stderr)
        raise SystemExit(2) from None
    except (ValueError, OSError, UserInputError) as err:  # missing files, an existing output, an unsupported model
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    print(f"wrote {out} in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
