"""What a training run keeps across restarts, and how a checkpoint saves and restores it (GRPO, SFT, DPO, RM).

A checkpoint ``step_N`` written by `save_run_checkpoint` holds (besides CheckpointManager's ``training_info.json``
and ``config.yaml``) ``policy/{weights,optimizer,tokenizer}`` (optionally ``policy/hf``) and
``train_dataloader.pt``: the prompt loader's position and the python / numpy / torch RNG states, so that a resumed
run draws the same batches and random numbers as an uninterrupted one. ``training_info.json`` also records the
model's identity (`model_identity`), so that a run refuses a checkpoint of another model before loading anything.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers import AutoConfig

from nemo_rl_clone.algorithms.run.save_guard import guarded_save
from nemo_rl_clone.algorithms.utils import set_seed
from nemo_rl_clone.models.huggingface import resolve_model_path
from nemo_rl_clone.utils.config_validation import config_to_dict
from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.utils.progress import console

if TYPE_CHECKING:
    from collections.abc import Callable

    from nemo_rl_clone.data.dataloader import StatefulPromptLoader
    from nemo_rl_clone.models.policy.lm_policy import Policy
    from nemo_rl_clone.utils.checkpoint import CheckpointManager
    from nemo_rl_clone.utils.logger import Logger

logger = logging.getLogger(__name__)

DATALOADER_FILE = "train_dataloader.pt"
# Test hook: a save prints a marker line and waits, files written but not yet renamed into place, so that tests can
# signal or kill a run in the middle of a save: "SECONDS" pauses every save, "SECONDS@STEP" only that step's.
SAVE_PAUSE_ENV = "NRL_TEST_SAVE_PAUSE"
# What must match for checkpoint weights to fit a model; the name may differ (an alias, a moved folder).
_IDENTITY_KEYS = ("architecture", "hidden_size", "num_hidden_layers", "vocab_size", "tokenizer_vocab_size")


@dataclass
class RunState:
    """Counters and the last metrics of a run; ``training_info()`` is what ``training_info.json`` stores.

    ``val_metrics`` / ``train_metrics`` appear there as ``{"val": {...}, "train": {...}}``, so
    ``checkpointing.metric_name: "val:loss"`` ranks checkpoints by ``val_metrics["loss"]``. ``model`` is the run's
    `model_identity` (set by `restore_run_state`).
    """

    step: int = 0
    total_valid_samples: int = 0
    val_metrics: dict[str, float] = field(default_factory=dict)
    train_metrics: dict[str, float] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    monitors: dict[str, Any] = field(default_factory=dict)  # GRPO's collapse monitors (`CollapseMonitors.state_dict`)

    def begin_step(self) -> int:
        """Start the next step and return its number. Forgets the last validation's metrics: a checkpoint saved on a
        step without validation must not rank (keep_top_k) by the accuracy of older weights."""
        self.val_metrics = {}
        return self.step + 1

    def training_info(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "total_valid_samples": self.total_valid_samples,
            "val": dict(self.val_metrics),
            "train": dict(self.train_metrics),
            "model": dict(self.model),
            "monitors": dict(self.monitors),
        }

    @classmethod
    def from_training_info(cls, info: Mapping[str, Any]) -> RunState:
        return cls(
            step=int(info["step"]),
            total_valid_samples=int(info.get("total_valid_samples", 0)),
            val_metrics=dict(info.get("val", {})),
            train_metrics=dict(info.get("train", {})),
            monitors=dict(info.get("monitors", {})),
        )


def run_validation(
    validate: Callable[[], dict[str, float]], state: RunState, logger: Logger, step: int, shown: tuple[str, ...]
) -> dict[str, float]:
    """Run ``validate``; log its metrics (``validation/*``) and time, keep them as ``state.val_metrics`` (what
    checkpoints are ranked by) and print the ``shown`` ones. An empty result (no validation data) logs nothing."""
    start = time.perf_counter()
    metrics = validate()
    if metrics:
        state.val_metrics = metrics
        logger.log_metrics(metrics, step, prefix="validation")
        logger.log_metrics({"total_validation_time": time.perf_counter() - start}, step, prefix="timing/validation")
        console.print(f"[bold]step {step}: validation " + format_metrics(metrics, shown))
    return metrics


def format_metrics(metrics: Mapping[str, float], shown: tuple[str, ...]) -> str:
    """``"loss 0.6931, accuracy 0.5000"``: the ``shown`` keys that ``metrics`` has, in that order."""
    return ", ".join(f"{key} {metrics[key]:.4f}" for key in shown if key in metrics)


set_seeds = set_seed  # one seeding routine for every algorithm


def model_identity(model_name: str, tokenizer: Any, backend: str = "dtensor") -> dict[str, Any]:
    """The name, architecture, sizes and tokenizer vocabulary of ``model_name``, and the policy ``backend`` (whose
    checkpoint format the weights are in): what decides whether a checkpoint's weights belong to the run. Reads the
    model's ``config.json`` only."""
    config = AutoConfig.from_pretrained(resolve_model_path(model_name))
    architectures = getattr(config, "architectures", None) or [config.model_type]
    return {
        "name": model_name,
        "architecture": architectures[0],
        "hidden_size": getattr(config, "hidden_size", None),
        "num_hidden_layers": getattr(config, "num_hidden_layers", None),
        "vocab_size": getattr(config, "vocab_size", None),
        "tokenizer_vocab_size": len(tokenizer),
        "backend": backend,
    }


def _describe(model: Mapping[str, Any]) -> str:
    return (
        f"{model.get('name')} ({model.get('architecture')}, hidden_size {model.get('hidden_size')}, "
        f"num_hidden_layers {model.get('num_hidden_layers')}, vocab_size {model.get('vocab_size')}, "
        f"tokenizer {model.get('tokenizer_vocab_size')} tokens)"
    )


def check_checkpoint_model(checkpointer: CheckpointManager, model: Mapping[str, Any]) -> None:
    """Pick the checkpoint to resume from and refuse (a one-line :class:`UserInputError`) one of another model.

    The newest checkpoint that passes its manifest is the one (`CheckpointManager.verify_latest`: newer ones that
    fail are moved aside). Called before Ray starts and before any weights load. Checkpoints written before the
    identity was recorded pass unchecked.
    """
    latest = checkpointer.verify_latest() if checkpointer.cfg.enabled else None
    saved = checkpointer.load_training_info(latest).get("model") if latest is not None else None
    # Checkpoints from before the backend was recorded are DTensor's (the only backend then).
    saved_backend, backend = (saved or {}).get("backend", "dtensor"), model.get("backend", "dtensor")
    if saved and saved_backend != backend:
        raise UserInputError(
            f"checkpointing.checkpoint_dir {checkpointer.checkpoint_dir} holds a checkpoint of the {saved_backend} "
            f"policy backend, but this run uses the {backend} backend (their checkpoint formats differ): use another "
            "checkpoint_dir, or convert the checkpoint to Hugging Face (examples/converters/) and start from that"
        )
    if not saved or all(saved.get(key) == model.get(key) for key in _IDENTITY_KEYS):
        return
    raise UserInputError(
        f"checkpointing.checkpoint_dir {checkpointer.checkpoint_dir} holds a checkpoint of {_describe(saved)}, "
        f"but policy.model_name is {_describe(model)}: use another checkpoint_dir or delete it"
    )


def restore_run_state(
    checkpointer: CheckpointManager, dataloader: StatefulPromptLoader, model: Mapping[str, Any]
) -> tuple[RunState, str | None, str | None]:
    """(state, policy weights path, optimizer path) of the latest checkpoint; a fresh state and Nones without one.

    Restores the dataloader position and the RNG states in place; the state records ``model`` (`model_identity`,
    already checked against the checkpoint by `check_checkpoint_model`). Checkpointing disabled means: never resume.
    """
    latest = checkpointer.get_latest_checkpoint_path() if checkpointer.cfg.enabled else None
    if latest is None:
        return RunState(model=dict(model)), None, None
    state = RunState.from_training_info(checkpointer.load_training_info(latest))
    state.model = dict(model)
    extra = torch.load(latest / DATALOADER_FILE, weights_only=False)
    saved_seed = extra["dataloader"].get("seed", dataloader.seed)
    if saved_seed != dataloader.seed:  # its data order and sampling seeds would not be this run's
        raise UserInputError(
            f"checkpointing.checkpoint_dir {checkpointer.checkpoint_dir} holds a run with seed {saved_seed}, but this "
            f"run's seed is {dataloader.seed}: resume with seed {saved_seed}, or use another checkpoint_dir"
        )
    dataloader.load_state_dict(extra["dataloader"])
    random.setstate(extra["rng"]["python"])
    np.random.set_state(extra["rng"]["numpy"])
    torch.set_rng_state(extra["rng"]["torch"])
    logger.info("Resuming from %s (step %d)", latest, state.step)
    print(f"Resuming from checkpoint {latest} (step {state.step})")
    optimizer = latest / "policy" / "optimizer"
    if not optimizer.exists():  # saved with checkpointing.save_optimizer=false
        print(
            f"Checkpoint {latest} holds no optimizer state (checkpointing.save_optimizer=false): resuming with a fresh "
            "optimizer and learning-rate schedule"
        )
        return state, str(latest / "policy" / "weights"), None
    return state, str(latest / "policy" / "weights"), str(optimizer)


def save_run_checkpoint(
    checkpointer: CheckpointManager,
    policy: Policy,
    dataloader: StatefulPromptLoader,
    state: RunState,
    run_config: Any,
    extra_models: Mapping[str, Policy] | None = None,
) -> Path | None:
    """Write ``step_{state.step}`` through ``tmp_step_N`` (atomic rename); the manager prunes to the top-k afterwards.

    ``extra_models`` are further trained models of the run (PPO's critic), each saved under ``<name>/weights`` and
    ``<name>/optimizer`` next to ``policy/``, inside the same atomic save and manifest.

    ``run_config`` (the run's validated config) is saved as the checkpoint's ``config.yaml``; its
    ``checkpointing.save_consolidated`` adds a Hugging Face folder at ``policy/hf`` with
    ``checkpointing.model_save_format`` weights; ``checkpointing.save_optimizer=false`` leaves the optimizer state out.
    A save the disk cannot hold follows ``checkpointing.on_save_failure`` (`save_guard`): None with ``continue``.
    """
    checkpointing = run_config.checkpointing

    def write() -> Path:
        tmp = checkpointer.init_tmp_checkpoint(state.step, state.training_info(), config_to_dict(run_config))
        policy.save_checkpoint(
            weights_path=str(tmp / "policy" / "weights"),
            optimizer_path=str(tmp / "policy" / "optimizer") if checkpointing.save_optimizer else None,
            tokenizer_path=str(tmp / "policy" / "tokenizer"),
            save_hf_path=str(tmp / "policy" / "hf") if checkpointing.save_consolidated else None,
            save_hf_format=checkpointing.model_save_format or "safetensors",  # null only without a consolidated folder
        )
        for name, model in (extra_models or {}).items():
            model.save_checkpoint(
                weights_path=str(tmp / name / "weights"),
                optimizer_path=str(tmp / name / "optimizer") if checkpointing.save_optimizer else None,
            )
        rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
        torch.save({"dataloader": dataloader.state_dict(), "rng": rng}, tmp / DATALOADER_FILE)
        seconds, _, at_step = os.environ.get(SAVE_PAUSE_ENV, "").partition("@")
        if seconds and at_step in ("", str(state.step)):  # bounded: a forgotten run goes on by itself
            print(f"checkpoint save paused ({SAVE_PAUSE_ENV}) in {tmp}", flush=True)
            time.sleep(float(seconds))
        return checkpointer.finalize_checkpoint(tmp)

    path = guarded_save(checkpointer, state.step, run_config, write, checkpointing.on_save_failure)
    if path is not None:
        console.print(f"[green]step {state.step}: saved checkpoint {path}")
    return path
