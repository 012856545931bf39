"""What a training run keeps across restarts, and how a checkpoint saves and restores it (GRPO, SFT, DPO, RM).

A checkpoint ``step_N`` written by `save_run_checkpoint` holds (besides CheckpointManager's ``training_info.json``
and ``config.yaml``) ``policy/{weights,optimizer,tokenizer}`` (optionally ``policy/hf``) and
``train_dataloader.pt``: the prompt loader's position and the python / numpy / torch RNG states, so that a resumed
run draws the same batches and random numbers as an uninterrupted one.
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

from nemo_rl_clone.utils.progress import console

if TYPE_CHECKING:
    from collections.abc import Callable

    from nemo_rl_clone.data.dataloader import StatefulPromptLoader
    from nemo_rl_clone.models.policy.lm_policy import Policy
    from nemo_rl_clone.utils.checkpoint import CheckpointManager
    from nemo_rl_clone.utils.logger import Logger

logger = logging.getLogger(__name__)

DATALOADER_FILE = "train_dataloader.pt"
# Test hook: seconds a save waits, files written but not yet renamed into place, after printing a marker line.
SAVE_PAUSE_ENV = "NRL_TEST_SAVE_PAUSE_S"


@dataclass
class RunState:
    """Counters and the last metrics of a run; ``training_info()`` is what ``training_info.json`` stores.

    ``val_metrics`` / ``train_metrics`` appear there as ``{"val": {...}, "train": {...}}``, so
    ``checkpointing.metric_name: "val:loss"`` ranks checkpoints by ``val_metrics["loss"]``.
    """

    step: int = 0
    total_valid_samples: int = 0
    val_metrics: dict[str, float] = field(default_factory=dict)
    train_metrics: dict[str, float] = field(default_factory=dict)

    def training_info(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "total_valid_samples": self.total_valid_samples,
            "val": dict(self.val_metrics),
            "train": dict(self.train_metrics),
        }

    @classmethod
    def from_training_info(cls, info: Mapping[str, Any]) -> RunState:
        return cls(
            step=int(info["step"]),
            total_valid_samples=int(info.get("total_valid_samples", 0)),
            val_metrics=dict(info.get("val", {})),
            train_metrics=dict(info.get("train", {})),
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


def set_seeds(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def restore_run_state(
    checkpointer: CheckpointManager, dataloader: StatefulPromptLoader
) -> tuple[RunState, str | None, str | None]:
    """(state, policy weights path, optimizer path) of the latest checkpoint; a fresh state and Nones without one.

    Restores the dataloader position and the RNG states in place. Checkpointing disabled means: never resume.
    """
    latest = checkpointer.get_latest_checkpoint_path() if checkpointer.cfg.enabled else None
    if latest is None:
        return RunState(), None, None
    state = RunState.from_training_info(checkpointer.load_training_info(latest))
    extra = torch.load(latest / DATALOADER_FILE, weights_only=False)
    dataloader.load_state_dict(extra["dataloader"])
    random.setstate(extra["rng"]["python"])
    np.random.set_state(extra["rng"]["numpy"])
    torch.set_rng_state(extra["rng"]["torch"])
    logger.info("Resuming from %s (step %d)", latest, state.step)
    print(f"Resuming from checkpoint {latest} (step {state.step})")
    return state, str(latest / "policy" / "weights"), str(latest / "policy" / "optimizer")


def save_run_checkpoint(
    checkpointer: CheckpointManager,
    policy: Policy,
    dataloader: StatefulPromptLoader,
    state: RunState,
    run_config: Mapping[str, Any],
    save_consolidated: bool = False,
) -> Path:
    """Write ``step_{state.step}`` through ``tmp_step_N`` (atomic rename); the manager prunes to the top-k afterwards.

    ``run_config`` (the resolved config as plain dicts) is saved as the checkpoint's ``config.yaml``;
    ``save_consolidated`` adds a Hugging Face folder at ``policy/hf``.
    """
    tmp = checkpointer.init_tmp_checkpoint(state.step, state.training_info(), run_config)
    policy.save_checkpoint(
        weights_path=str(tmp / "policy" / "weights"),
        optimizer_path=str(tmp / "policy" / "optimizer"),
        tokenizer_path=str(tmp / "policy" / "tokenizer"),
        save_hf_path=str(tmp / "policy" / "hf") if save_consolidated else None,
    )
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save({"dataloader": dataloader.state_dict(), "rng": rng}, tmp / DATALOADER_FILE)
    if pause_s := float(os.environ.get(SAVE_PAUSE_ENV, 0)):  # tests: a save that is surely in progress
        print(f"checkpoint save paused ({SAVE_PAUSE_ENV}) in {tmp}", flush=True)
        time.sleep(pause_s)
    return checkpointer.finalize_checkpoint(tmp)
