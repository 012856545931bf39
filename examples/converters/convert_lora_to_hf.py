"""Export a LoRA run's checkpoint: the base model with the adapters merged in, or the adapter alone (peft format).

    # merged Hugging Face folder (transformers and vLLM load it, like convert_dcp_to_hf.py's output)
    uv run examples/converters/convert_lora_to_hf.py --config results/sft/step_50/config.yaml \\
        --dcp-ckpt-path results/sft/step_50/policy/weights --hf-ckpt-path results/sft/hf_step_50
    # the adapter alone: adapter_model.safetensors + adapter_config.json
    uv run examples/converters/convert_lora_to_hf.py ... --adapter-only --hf-ckpt-path results/sft/adapter_step_50

A LoRA run (``policy.dtensor_cfg.lora_cfg.enabled``) checkpoints only its adapters; the base weights are those of
``policy.model_name`` in the run's ``config.yaml``. The adapter folder loads with
``peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(<base model>), <folder>)``; vLLM serves it with
``enable_lora=True``. Runs on one CPU process.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from convert_dcp_to_hf import _policy_section, convert_dcp_to_hf

from nemo_rl_clone.models.hf_export import load_dcp_model_state_dict
from nemo_rl_clone.models.huggingface import resolve_model_path
from nemo_rl_clone.models.policy.dtensor import lora
from nemo_rl_clone.utils.config import load_config, resolve_to_container
from nemo_rl_clone.utils.config_validation import ConfigError


def export_adapter(config_path: Path, dcp_ckpt_path: Path, out_dir: Path, overwrite: bool = False) -> Path:
    """Write the checkpoint's adapters as a peft adapter folder at ``out_dir``."""
    policy = _policy_section(resolve_to_container(load_config(config_path)), config_path)
    lora_config = lora.run_lora_config(policy)
    if lora_config is None:
        raise ConfigError(
            [
                f"{config_path}: this run trained without LoRA (policy.dtensor_cfg.lora_cfg.enabled is false); its "
                "checkpoint holds the full model: use convert_dcp_to_hf.py"
            ]
        )
    if out_dir.exists():
        if not overwrite:
            raise FileExistsError(f"{out_dir} exists; pass --overwrite to replace it")
        shutil.rmtree(out_dir)
    adapters = load_dcp_model_state_dict(dcp_ckpt_path)
    base_model = resolve_model_path(str(policy["model_name"]))  # a built-in name becomes its folder
    return lora.save_peft_adapter(adapters, lora_config, base_model, out_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="the run's config.yaml (e.g. step_N/config.yaml)")
    parser.add_argument("--dcp-ckpt-path", type=Path, required=True, help="DCP weights folder (step_N/policy/weights)")
    parser.add_argument("--hf-ckpt-path", type=Path, required=True, help="output folder")
    parser.add_argument("--adapter-only", action="store_true", help="write the peft adapter, not the merged model")
    parser.add_argument("--tokenizer-path", type=Path, default=None, help="default: step_N/policy/tokenizer if present")
    parser.add_argument("--dtype", default=None, help="merged model: cast weights, e.g. bfloat16")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --hf-ckpt-path")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        if args.adapter_only:
            out = export_adapter(args.config, args.dcp_ckpt_path, args.hf_ckpt_path, args.overwrite)
        else:
            out = convert_dcp_to_hf(
                args.config, args.dcp_ckpt_path, args.hf_ckpt_path, args.tokenizer_path, args.dtype, args.overwrite
            )
    except ConfigError as err:
        print("\n".join(f"error: {p}" for p in err.problems), file=sys.stderr)
        raise SystemExit(2) from None
    except (ValueError, OSError, KeyError) as err:  # missing files, an existing output, adapters that do not fit
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    print(f"wrote {out} in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
