"""What ``generation.model_name`` of an evaluation names, as a Hugging Face folder vLLM can load.

Accepted: a Hugging Face folder, a built-in model name, a hub id, or a checkpoint written by any algorithm
(GRPO, SFT, DPO share `CheckpointManager`'s layout)::

    <checkpoint_dir>/step_N/{training_info.json, config.yaml, policy/{weights, tokenizer, hf?}}

(``weights``: torch DCP, or Megatron's distributed checkpoint for a ``policy.megatron_cfg`` run).

``step_N`` (or ``step_N/policy``) evaluates that step; ``<checkpoint_dir>`` evaluates its latest complete step.

- ``policy/hf`` (written when ``checkpointing.save_consolidated`` is true) is loaded as is.
- Otherwise the weights are converted once, the way ``examples/converters/convert_dcp_to_hf.py`` (or
  ``convert_megatron_to_hf.py``) does it
  (architecture from ``config.yaml``'s ``policy.model_name``, tokenizer from ``policy/tokenizer``), into
  ``policy/hf`` — the very folder a consolidated save would have written — so every later evaluation of that
  checkpoint reuses it, and it goes away when the checkpoint is pruned. A read-only checkpoint is converted into a
  temporary folder instead, removed when the evaluation ends (`EvalModel.cleanup`).
- Reward-model checkpoints (``policy.reward_model_cfg.enabled``, or a ``*ForSequenceClassification`` folder) have
  a score head and no language-model head: they raise `EvalModelError` instead of generating nonsense.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nemo_rl_clone.utils.checkpoint import CONFIG_FILE, TRAINING_INFO_FILE, find_checkpoint_step
from nemo_rl_clone.utils.errors import UserInputError

_STEP_DIR = re.compile(r"^step_(\d+)$")


class EvalModelError(UserInputError, ValueError):
    """``generation.model_name`` cannot be evaluated (a reward model, an incomplete checkpoint, an unknown name)."""


@dataclass
class EvalModel:
    """A model ready for evaluation.

    Attributes:
        model_path: what the engines load (a folder, a built-in name or a hub id).
        tokenizer_path: the tokenizer to use unless ``tokenizer.name`` says otherwise.
        description: where the weights came from, for the summary.
        step: the training step of a checkpoint (None for other models); metrics are logged at this step.
        temporary_dir: a conversion folder to delete after the evaluation (read-only checkpoints only).
    """

    model_path: str
    tokenizer_path: str
    description: str
    step: int | None = None
    temporary_dir: Path | None = None

    def cleanup(self) -> None:
        if self.temporary_dir is not None:
            shutil.rmtree(self.temporary_dir, ignore_errors=True)
            self.temporary_dir = None


def resolve_eval_model(model_name: str) -> EvalModel:
    """Turn ``generation.model_name`` into an `EvalModel` (see the module docstring).

    Raises:
        EvalModelError: a reward-model checkpoint or folder, a checkpoint without weights or ``config.yaml``, a
            missing folder or a name that cannot be loaded.
    """
    path = Path(model_name).expanduser()
    step_dir = find_checkpoint_step(path) if path.is_dir() else None
    if step_dir is not None:
        return _from_checkpoint(step_dir)
    from nemo_rl_clone.models.huggingface import check_model_available

    try:  # builds a built-in model once; a hub id is looked up (bounded wait) before any engine starts
        resolved = check_model_available(model_name)
    except OSError as error:  # FileNotFoundError included
        raise EvalModelError(f"generation.model_name: {error}") from None
    if os.path.isdir(resolved):
        _reject_reward_model_folder(Path(resolved))
    return EvalModel(model_path=model_name, tokenizer_path=model_name, description=model_name)


def _from_checkpoint(step_dir: Path) -> EvalModel:
    run_config = _run_config(step_dir)
    policy = run_config.get("policy")
    policy_cfg: dict[str, Any] = policy if isinstance(policy, dict) else {}
    # The export written here is the folder `save_consolidated` would have written: same weight format.
    save_format = (run_config.get("checkpointing") or {}).get("model_save_format") or "safetensors"
    if (policy_cfg.get("reward_model_cfg") or {}).get("enabled"):
        raise EvalModelError(
            f"{step_dir} is a reward-model checkpoint (policy.reward_model_cfg.enabled: true in its {CONFIG_FILE}): "
            "it scores text with a scalar head and cannot generate; evaluate a policy (causal LM) checkpoint"
        )
    step = _step_number(step_dir)
    policy_dir = step_dir / "policy"
    tokenizer_dir = policy_dir / "tokenizer"
    hf_dir = policy_dir / "hf"
    if (hf_dir / "config.json").is_file():
        _reject_reward_model_folder(hf_dir)
        tokenizer = tokenizer_dir if tokenizer_dir.is_dir() else hf_dir
        return EvalModel(str(hf_dir), str(tokenizer), f"checkpoint {step_dir} (its Hugging Face export)", step)
    if not (policy_dir / "weights" / ".metadata").is_file():
        raise EvalModelError(f"{step_dir}: checkpoint has neither policy/hf nor DCP weights in policy/weights")

    temporary_dir = None
    if is_writable(policy_dir):
        # One converter per checkpoint at a time: evaluations that start together wait for the first one's export
        # instead of each converting. The lock is on the policy folder itself, so the checkpoint gains only the export.
        folder = os.open(policy_dir, os.O_RDONLY)
        try:
            fcntl.flock(folder, fcntl.LOCK_EX)
            exported_meanwhile = (hf_dir / "config.json").is_file()
            if not exported_meanwhile:
                convert_checkpoint_to_hf(step_dir, policy_cfg, hf_dir, save_format)
        finally:
            os.close(folder)  # releases the lock
        where = "its Hugging Face export" if exported_meanwhile else f"DCP weights converted to {hf_dir}"
    else:
        temporary_dir = Path(tempfile.mkdtemp(prefix="nrl-eval-hf-"))
        hf_dir = convert_checkpoint_to_hf(step_dir, policy_cfg, temporary_dir / "hf", save_format)
        where = f"read-only: DCP weights converted to the temporary {hf_dir}"
    tokenizer = tokenizer_dir if tokenizer_dir.is_dir() else hf_dir
    return EvalModel(str(hf_dir), str(tokenizer), f"checkpoint {step_dir} ({where})", step, temporary_dir)


def is_writable(folder: Path) -> bool:
    """Whether the conversion may be cached inside the checkpoint (False on read-only storage)."""
    return os.access(folder, os.W_OK)


def convert_checkpoint_to_hf(
    step_dir: Path, policy_cfg: dict[str, Any], out_dir: Path, save_format: str = "safetensors"
) -> Path:
    """Write ``out_dir`` (an HF folder, ``save_format`` weights) from ``step_dir/policy/weights``: the converters'
    steps (``convert_dcp_to_hf.py``, or ``convert_megatron_to_hf.py`` for a Megatron-backend run), as a function."""
    from transformers import AutoConfig

    from nemo_rl_clone.models.hf_export import save_consolidated_hf
    from nemo_rl_clone.models.huggingface import load_tokenizer, resolve_model_path
    from nemo_rl_clone.models.policy.dtensor import lora
    from nemo_rl_clone.models.policy.megatron.export import (
        export_in_subprocess,
        is_megatron_run,
        single_process_policy,
    )

    model_name = policy_cfg.get("model_name")
    if not isinstance(model_name, str):
        raise EvalModelError(f"{step_dir / CONFIG_FILE}: policy.model_name is missing; it names the architecture")
    saved_tokenizer = step_dir / "policy" / "tokenizer"
    tokenizer_name = (policy_cfg.get("tokenizer") or {}).get("name") or model_name
    tokenizer_path = str(saved_tokenizer) if saved_tokenizer.is_dir() else tokenizer_name
    weights = step_dir / "policy" / "weights"
    if is_megatron_run(policy_cfg):  # Megatron's distributed checkpoint: rebuilt and converted in a child process
        policy = single_process_policy(policy_cfg, str(step_dir / CONFIG_FILE))
        return export_in_subprocess(policy, weights, out_dir, tokenizer_path, save_format)
    model_path = resolve_model_path(model_name)
    model_config = AutoConfig.from_pretrained(model_path)
    tokenizer = load_tokenizer(tokenizer_path)
    state_dict = lora.checkpoint_state_dict(weights, policy_cfg, model_path)  # LoRA runs saved adapters only
    return save_consolidated_hf(state_dict, model_config, out_dir, tokenizer=tokenizer, save_format=save_format)


def _run_config(step_dir: Path) -> dict[str, Any]:
    path = step_dir / CONFIG_FILE
    if not path.is_file():
        raise EvalModelError(f"{step_dir}: checkpoint has no {CONFIG_FILE} (it names the model architecture)")
    loaded = yaml.safe_load(path.read_text())
    if not isinstance(loaded, dict):
        raise EvalModelError(f"{path}: expected a mapping, got {type(loaded).__name__}")
    return loaded


def _step_number(step_dir: Path) -> int | None:
    info = step_dir / TRAINING_INFO_FILE
    if info.is_file():
        step = json.loads(info.read_text()).get("step")
        if isinstance(step, int):
            return step
    match = _STEP_DIR.match(step_dir.name)
    return int(match.group(1)) if match else None


def _reject_reward_model_folder(folder: Path) -> None:
    config_path = folder / "config.json"
    if not config_path.is_file():
        return
    architectures = json.loads(config_path.read_text()).get("architectures") or []
    heads = [a for a in architectures if a.endswith("ForSequenceClassification")]
    if heads:
        raise EvalModelError(
            f"{folder} holds a reward model ({heads[0]}): it scores text with a scalar head and cannot generate; "
            "evaluate a policy (causal LM) model or checkpoint"
        )
