"""Convert a training checkpoint's DCP weights into a Hugging Face folder (transformers and vLLM load it).

    uv run examples/converters/convert_dcp_to_hf.py --config results/grpo/step_50/config.yaml \\
        --dcp-ckpt-path results/grpo/step_50/policy/weights --hf-ckpt-path results/grpo/hf_step_50

The run's ``config.yaml`` names the model (``policy.model_name``), which gives the architecture config. The
tokenizer is the one saved with the checkpoint (``policy/tokenizer`` next to the weights) when present, else
``policy.tokenizer.name`` (or the model's). The weights are written as the run's ``checkpointing.model_save_format``
(``safetensors``, the default, or ``torch_save``). A LoRA run (``policy.dtensor_cfg.lora_cfg.enabled``) saved only
its adapters: they are merged into the base model's weights (``convert_lora_to_hf.py --adapter-only`` exports the
adapter alone). Runs on one CPU process; no GPU or process group needed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from transformers import AutoConfig

from nemo_rl_clone.models.hf_export import save_consolidated_hf
from nemo_rl_clone.models.huggingface import load_tokenizer, resolve_model_path
from nemo_rl_clone.models.policy.dtensor import lora
from nemo_rl_clone.utils.checkpoint import require_verified_weights
from nemo_rl_clone.utils.config import load_config, resolve_to_container
from nemo_rl_clone.utils.config_validation import ConfigError


def convert_dcp_to_hf(
    config_path: Path,
    dcp_ckpt_path: Path,
    hf_ckpt_path: Path,
    tokenizer_path: Path | None = None,
    dtype: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``hf_ckpt_path`` from the DCP weights at ``dcp_ckpt_path``; see the module docstring."""
    require_verified_weights(dcp_ckpt_path)  # a damaged checkpoint is named, not converted
    config = resolve_to_container(load_config(config_path))
    policy = _policy_section(config, config_path)
    save_format = (config.get("checkpointing") or {}).get("model_save_format") or "safetensors"
    model_name = policy.get("model_name")
    if not isinstance(model_name, str):
        raise ConfigError([f"{config_path}: policy.model_name is missing or not a string"])
    model_path = resolve_model_path(model_name)
    model_config = AutoConfig.from_pretrained(model_path)

    if tokenizer_path is None:
        saved = dcp_ckpt_path.parent / "tokenizer"
        tokenizer_name = (policy.get("tokenizer") or {}).get("name") or model_name
        tokenizer_path = saved if saved.is_dir() else Path(tokenizer_name)
    tokenizer = load_tokenizer(str(tokenizer_path))

    state_dict = lora.checkpoint_state_dict(dcp_ckpt_path, policy, model_path)
    return save_consolidated_hf(
        state_dict,
        model_config,
        hf_ckpt_path,
        tokenizer=tokenizer,
        dtype=dtype,
        overwrite=overwrite,
        save_format=save_format,
    )


def _policy_section(config: dict[str, Any], config_path: Path) -> dict[str, Any]:
    policy = config.get("policy")
    if not isinstance(policy, dict):
        raise ConfigError([f"{config_path}: no 'policy' section (expected the config.yaml saved with the checkpoint)"])
    return policy


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="the run's config.yaml (e.g. step_N/config.yaml)")
    parser.add_argument("--dcp-ckpt-path", type=Path, required=True, help="DCP weights folder (step_N/policy/weights)")
    parser.add_argument("--hf-ckpt-path", type=Path, required=True, help="output Hugging Face folder")
    parser.add_argument("--tokenizer-path", type=Path, default=None, help="default: step_N/policy/tokenizer if present")
    parser.add_argument("--dtype", default=None, help="cast weights, e.g. bfloat16 (default: keep the saved dtype)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --hf-ckpt-path")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        out = convert_dcp_to_hf(
            args.config, args.dcp_ckpt_path, args.hf_ckpt_path, args.tokenizer_path, args.dtype, args.overwrite
        )
    except ConfigError as err:
        print("\n".join(f"error: {p}" for p in err.problems), file=sys.stderr)
        raise SystemExit(2) from None
    except (ValueError, OSError) as err:  # missing files, an existing output, a state dict that does not fit
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    print(f"wrote {out} in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
