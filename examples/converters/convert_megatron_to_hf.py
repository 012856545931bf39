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
import sys
import time
from pathlib import Path
from typing import Any

from nemo_rl_clone.models.policy.megatron.export import export_megatron_checkpoint, single_process_policy
from nemo_rl_clone.utils.checkpoint import require_verified_weights
from nemo_rl_clone.utils.config import load_config, resolve_to_container
from nemo_rl_clone.utils.config_validation import ConfigError
from nemo_rl_clone.utils.errors import UserInputError


def convert_megatron_to_hf(
    config_path: Path,
    megatron_ckpt_path: Path,
    hf_ckpt_path: Path,
    tokenizer_path: Path | None = None,
    dtype: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``hf_ckpt_path`` from the Megatron weights at ``megatron_ckpt_path``; see the module docstring."""
    require_verified_weights(megatron_ckpt_path)  # a damaged checkpoint is named, not converted
    config = resolve_to_container(load_config(config_path))
    policy_section = _policy_section(config, config_path)
    save_format = (config.get("checkpointing") or {}).get("model_save_format") or "safetensors"
    policy = single_process_policy(policy_section, str(config_path))
    if tokenizer_path is None:
        saved = megatron_ckpt_path.parent / "tokenizer"
        tokenizer_path = saved if saved.is_dir() else Path(policy.tokenizer.name or policy.model_name)
    return export_megatron_checkpoint(
        policy, megatron_ckpt_path, hf_ckpt_path, str(tokenizer_path), save_format, dtype, overwrite
    )


def _policy_section(config: dict[str, Any], config_path: Path) -> dict[str, Any]:
    policy = config.get("policy")
    if not isinstance(policy, dict):
        raise ConfigError([f"{config_path}: no 'policy' section (expected the config.yaml saved with the checkpoint)"])
    return policy


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
