"""Crash-safe checkpoint directories with top-k retention (docs/logging_and_checkpoints.md).

Layout: ``checkpoint_dir/step_N/{training_info.json, config.yaml, ...}``; callers add ``policy/...``,
``train_dataloader.pt`` and so on. A checkpoint is written into ``tmp_step_N`` and only becomes ``step_N`` by an
atomic rename after every file is fsynced, so a crash at any point leaves either the previous complete state or
the new complete state, never a half-written ``step_N``.

Names in ``checkpoint_dir`` and what they mean:

- ``step_N``: a complete checkpoint (it holds ``training_info.json``).
- ``tmp_*``: debris of an interrupted save, replace or prune; removed when a manager is constructed.
- ``old_step_N``: a complete checkpoint moved aside while a re-save of step N was being put in place (only on
  filesystems without an atomic directory exchange); restored as ``step_N`` on construction if the new one never
  arrived, otherwise removed.
- ``corrupt_step_N``: a checkpoint that failed its manifest (`checkpoint_manifest`) when a run looked for one to
  resume from; kept for inspection, never read or deleted.
- ``run.lock``: the advisory lock of the run that owns the directory (`checkpoint_lock`).

One manager (one process) owns a ``checkpoint_dir`` at a time; a run makes sure of it with ``lock=True``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from omegaconf import OmegaConf

from nemo_rl_clone.utils.checkpoint_fs import fsync_path, fsync_tree, replace_dir
from nemo_rl_clone.utils.checkpoint_lock import CheckpointDirLock
from nemo_rl_clone.utils.checkpoint_manifest import MANIFEST_FLAG, verify_checkpoint, write_manifest
from nemo_rl_clone.utils.checkpoint_ranking import check_rankable_metric, rank_best_first
from nemo_rl_clone.utils.checkpoint_schedule import parse_deadline
from nemo_rl_clone.utils.config_validation import SectionReads, as_config
from nemo_rl_clone.utils.errors import UserInputError, report_fault
from nemo_rl_clone.utils.unsupported_modules import refusing_getattr

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike[Any]  # NeMo-RL's alias: a path as str or pathlib.Path

# NeMo-RL's ``checkpointing.pretrained_checkpoint`` section (initial weights from a Megatron checkpoint) is not built.
__getattr__ = refusing_getattr(
    __name__,
    {"PretrainedCheckpointConfig": "initial weights from a Megatron checkpoint (the policy starts from model_name)"},
)

TRAINING_INFO_FILE = "training_info.json"
CONFIG_FILE = "config.yaml"
MODEL_SAVE_FORMATS = ("safetensors", "torch_save")
SAVE_FAILURE_ACTIONS = ("stop", "continue")

_STEP_RE = re.compile(r"^step_(\d+)$")
_TMP_STEP_RE = re.compile(r"^tmp_step_(\d+)$")
_OLD_STEP_RE = re.compile(r"^old_step_(\d+)$")


_NEMO_RL_DEFAULT_VAL_SET = "val:validation-default_"


@dataclass
class CheckpointingConfig(SectionReads):
    """The ``checkpointing`` config section (NeMo-RL keys).

    ``metric_name`` is ``"<prefix>:<name>"``, e.g. ``"val:accuracy"`` or ``"train:loss"``; see `get_metric` for
    how it is looked up in ``training_info``. ``checkpoint_must_save_by`` is a ``"DD:HH:MM:SS"`` budget measured
    from the start of the run: the train loop saves and stops before it runs out. ``save_consolidated`` adds a
    Hugging Face folder ``policy/hf`` to each checkpoint, its weights written as ``model_save_format``:
    ``safetensors`` (``model.safetensors``) or ``torch_save`` (``pytorch_model.bin``).
    """

    enabled: bool = True  # false: no checkpoints saved or resumed from
    checkpoint_dir: str = "results/grpo"  # holds step_N folders; a run resumes from its latest
    metric_name: str | None = "val:accuracy"
    higher_is_better: bool = True  # how keep_top_k ranks metric_name
    keep_top_k: int | None = 3  # keep the k best by metric_name (no metric: the k latest) and the latest; null: all
    save_period: int = 10  # save every this many steps
    checkpoint_must_save_by: str | None = None
    # null (NeMo-RL's value for DCP-only and Megatron checkpoints): no consolidated folder, so no format to pick.
    model_save_format: str | None = "safetensors"
    save_consolidated: bool = False
    # False: checkpoints hold no optimizer state (smaller, faster saves); a resumed run starts a fresh optimizer.
    save_optimizer: bool = True
    # After SIGTERM (a scheduler's warning before SIGKILL) the run has this long to stop at the next phase boundary
    # and save the last completed step; a save that would end later is not started or is abandoned.
    sigterm_grace_period_s: float = 60.0
    # Ours. A save that cannot fit the free disk space or fails mid-way (ENOSPC, EIO, a quota): "stop" ends the run
    # (exit code 74, the previous checkpoint intact), "continue" trains on without that checkpoint.
    on_save_failure: str = "stop"

    def __post_init__(self) -> None:
        # NeMo-RL names validation metrics per validation set, "val:validation-<set>_<metric>"; a run here has one
        # validation set, which NeMo-RL calls "default": its metric is this run's "val:<metric>".
        if self.metric_name is not None and self.metric_name.startswith(_NEMO_RL_DEFAULT_VAL_SET):
            self.metric_name = "val:" + self.metric_name.removeprefix(_NEMO_RL_DEFAULT_VAL_SET)

    def check(self) -> list[tuple[str, str]]:
        """Semantic problems as ``(key relative to this section, message)``; empty when valid."""
        problems: list[tuple[str, str]] = []
        if not self.checkpoint_dir:
            problems.append(("checkpoint_dir", "must be a non-empty path"))
        if self.save_period < 1:
            problems.append(("save_period", f"must be >= 1, got {self.save_period}"))
        if self.keep_top_k is not None and self.keep_top_k < 1:
            problems.append(("keep_top_k", f"must be >= 1 or null (keep all), got {self.keep_top_k}"))
        if self.metric_name is not None:
            prefix, sep, name = self.metric_name.partition(":")
            if not (sep and prefix and name):
                problems.append(
                    ("metric_name", f"must be '<prefix>:<name>' like 'val:accuracy' or null, got {self.metric_name!r}")
                )
        if self.checkpoint_must_save_by is not None:
            try:
                parse_deadline(self.checkpoint_must_save_by)
            except ValueError as e:
                problems.append(("checkpoint_must_save_by", str(e)))
        if not self.sigterm_grace_period_s > 0:
            problems.append(("sigterm_grace_period_s", f"must be > 0 seconds, got {self.sigterm_grace_period_s}"))
        if self.on_save_failure not in SAVE_FAILURE_ACTIONS:
            problems.append(
                ("on_save_failure", f"must be one of {list(SAVE_FAILURE_ACTIONS)}, got {self.on_save_failure!r}")
            )
        if self.model_save_format is None and self.save_consolidated:
            problems.append(
                ("model_save_format", f"null writes no consolidated folder; pick one of {list(MODEL_SAVE_FORMATS)}")
            )
        elif self.model_save_format not in (None, *MODEL_SAVE_FORMATS):
            problems.append(
                ("model_save_format", f"must be one of {list(MODEL_SAVE_FORMATS)}, got {self.model_save_format!r}")
            )
        return problems


# ----------------------------------------------------------------------------------------------------------------
# Manager
# ----------------------------------------------------------------------------------------------------------------


class CheckpointManager:
    """Writes, finds and prunes ``step_N`` checkpoints under ``cfg.checkpoint_dir``.

    Save protocol: ``tmp = init_tmp_checkpoint(step, info, config)``; write files under ``tmp``;
    ``final = finalize_checkpoint(tmp)``. Construction cleans debris left by a crashed predecessor.

    ``config`` is a `CheckpointingConfig` or NeMo-RL's plain ``checkpointing`` dict (validated into one, kept as
    ``cfg``; unknown keys are a `ConfigError`). NeMo-RL's attributes (``metric_name``, ``keep_top_k``, ...) read
    through to ``cfg``.
    """

    def __init__(self, config: CheckpointingConfig | Mapping[str, Any], *, lock: bool = False):
        self.cfg = as_config(config, CheckpointingConfig, key="checkpointing")
        self.checkpoint_dir = Path(self.cfg.checkpoint_dir)
        self._warned_missing_metric = False
        # Checkpoints whose files this process hashed (written) or verified: pruning never removes the last of them.
        self._verified: set[Path] = set()
        self.lock = CheckpointDirLock(self.checkpoint_dir) if lock else None
        if self.lock is not None:
            self.lock.acquire()  # before debris recovery: another live run's tmp_step_N is not debris
        self._recover_debris()

    @property
    def metric_name(self) -> str | None:
        return self.cfg.metric_name

    @property
    def higher_is_better(self) -> bool:
        return self.cfg.higher_is_better

    @property
    def keep_top_k(self) -> int | None:
        return self.cfg.keep_top_k

    @property
    def save_period(self) -> int:
        return self.cfg.save_period

    @property
    def save_optimizer(self) -> bool:
        return bool(getattr(self.cfg, "save_optimizer", True))

    # -- saving ---------------------------------------------------------------------------------------------------

    def init_tmp_checkpoint(self, step: int, training_info: Mapping[str, Any], run_config: Any | None = None) -> Path:
        """Create a fresh ``tmp_step_{step}`` holding ``training_info.json`` and ``config.yaml``; return its absolute
        path.

        ``run_config`` (dict, DictConfig or dataclass) is saved resolved; ``config.yaml`` is skipped when None.
        One-element numpy arrays and tensors in ``training_info`` are stored as their number.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"checkpoint step must be a non-negative int, got {step!r}")
        training_info = {key: _as_number(value) for key, value in training_info.items()}
        training_info[MANIFEST_FLAG] = True
        check_rankable_metric(training_info, self.cfg.metric_name)
        try:
            info_text = json.dumps(training_info, indent=2, sort_keys=True)
        except TypeError as e:
            raise TypeError(f"training_info for step {step} is not JSON-serializable: {e}") from e

        tmp_dir = self.checkpoint_dir / f"tmp_step_{step}"
        if tmp_dir.exists():
            logger.warning("Removing stale %s before saving step %d", tmp_dir, step)
            shutil.rmtree(tmp_dir)
        tmp_dir.mkdir(parents=True)
        (tmp_dir / TRAINING_INFO_FILE).write_text(info_text)
        if run_config is not None:
            (tmp_dir / CONFIG_FILE).write_text(OmegaConf.to_yaml(OmegaConf.create(run_config), resolve=True))
        return tmp_dir.absolute()

    def finalize_checkpoint(self, checkpoint_path: Path | str) -> Path:
        """fsync the ``tmp_step_N`` folder ``checkpoint_path``, atomically rename it to ``step_N`` (replacing a
        previous ``step_N``), then prune.

        Returns the final ``step_N`` path.
        """
        tmp_dir = Path(checkpoint_path)
        match = _TMP_STEP_RE.match(tmp_dir.name)
        if match is None or tmp_dir.parent.resolve() != self.checkpoint_dir.resolve():
            raise ValueError(
                f"{tmp_dir} is not a tmp_step_N directory made by init_tmp_checkpoint in {self.checkpoint_dir}"
            )
        if not (tmp_dir / TRAINING_INFO_FILE).is_file():
            raise FileNotFoundError(
                f"{tmp_dir / TRAINING_INFO_FILE} is missing; create the directory with init_tmp_checkpoint"
            )

        step = int(match.group(1))
        final_dir = self.checkpoint_dir / f"step_{step}"
        # Written last and renamed with the rest: a step_N always carries the manifest of exactly its files.
        write_manifest(tmp_dir, step, self.load_training_info(tmp_dir))
        fsync_tree(tmp_dir)
        replace_dir(tmp_dir, final_dir)
        fsync_path(self.checkpoint_dir)
        self._verified.add(final_dir)
        self.remove_old_checkpoints()
        return final_dir

    # -- queries --------------------------------------------------------------------------------------------------

    def list_checkpoints(self) -> list[tuple[int, Path]]:
        """Complete checkpoints as ``(step, path)``, ascending by step."""
        if not self.checkpoint_dir.is_dir():
            return []
        found = []
        for child in self.checkpoint_dir.iterdir():
            match = _STEP_RE.match(child.name)
            if match and (child / TRAINING_INFO_FILE).is_file():
                found.append((int(match.group(1)), child))
        return sorted(found)

    def get_latest_checkpoint_path(self) -> Path | None:
        """The complete checkpoint with the highest step, or None when there is none."""
        checkpoints = self.list_checkpoints()
        return checkpoints[-1][1] if checkpoints else None

    def verify_latest(self) -> Path | None:
        """The newest checkpoint that passes its manifest (see `checkpoint_manifest`); None when there is none.

        Newer ones that fail are reported in one line naming the file and moved aside to ``corrupt_step_N``; a
        checkpoint written before manifests existed is used with a notice. A `CheckpointsUnusable` (exit code 2) when
        checkpoints exist but none passes.
        """
        moved: list[str] = []
        for step, path in reversed(self.list_checkpoints()):
            try:
                problem = verify_checkpoint(path)
            except FileNotFoundError:
                print(f"Checkpoint {path} was written before checkpoints had manifests: resuming from it unverified")
                return path
            if problem is None:
                self._verified.add(path)
                return path
            aside = _free_name(self.checkpoint_dir / f"corrupt_step_{step}")
            os.rename(path, aside)
            moved.append(aside.name)
            report_fault(f"Checkpoint {path} fails verification: {problem}; moved aside to {aside.name}")
        if moved:
            raise CheckpointsUnusable(
                f"checkpointing.checkpoint_dir {self.checkpoint_dir}: no checkpoint passes verification (moved aside: "
                f"{', '.join(moved)}); restore one, or use another checkpoint_dir to start fresh"
            )
        return None

    def get_best_checkpoint_path(self) -> Path | None:
        """The best checkpoint by ``metric_name``/``higher_is_better`` (latest on ties or without a metric)."""
        ranked = self._ranked_best_first()
        return ranked[0][1] if ranked else None

    @overload
    @staticmethod
    def load_training_info(checkpoint_path: Path | str) -> dict[str, Any]: ...

    @overload
    @staticmethod
    def load_training_info(checkpoint_path: None = None) -> None: ...

    @staticmethod
    def load_training_info(checkpoint_path: Path | str | None = None) -> dict[str, Any] | None:
        """The ``training_info.json`` dict of the checkpoint directory ``checkpoint_path``; None when it is None (a
        fresh run, as `get_latest_checkpoint_path` returns)."""
        if checkpoint_path is None:
            return None
        info_path = Path(checkpoint_path) / TRAINING_INFO_FILE
        if not info_path.is_file():
            raise FileNotFoundError(f"{checkpoint_path} is not a complete checkpoint: {TRAINING_INFO_FILE} is missing")
        info: dict[str, Any] = json.loads(info_path.read_text())
        info.pop(MANIFEST_FLAG, None)  # ours, for verification; callers get back what they saved
        return info

    @staticmethod
    def get_resume_paths(
        last_checkpoint_path: Path | str | None, *, model_component: str = "policy"
    ) -> tuple[Path | None, Path | None]:
        """``(weights, optimizer)`` folders of ``model_component`` in a checkpoint; ``(None, None)`` without one.

        The optimizer path is None (with a warning) when the checkpoint holds no optimizer state, e.g. one saved with
        ``checkpointing.save_optimizer: false``: the optimizer then starts fresh.
        """
        if not last_checkpoint_path:
            return None, None
        component = Path(last_checkpoint_path) / model_component
        optimizer = component / "optimizer"
        if optimizer.exists():
            return component / "weights", optimizer
        warnings.warn(f"no optimizer state at {optimizer}; the optimizer starts fresh", stacklevel=2)
        return component / "weights", None

    # -- retention ------------------------------------------------------------------------------------------------

    def remove_old_checkpoints(self, exclude_latest: bool = True) -> list[Path]:
        """Apply ``keep_top_k`` and return the removed paths. The latest step is kept unless ``exclude_latest`` is
        False (it then stays only if it ranks among the top k).

        ``keep_top_k`` None keeps everything; ``metric_name`` None keeps the k latest; otherwise the k best by the
        metric plus the latest, with checkpoints lacking the metric ranked last.
        """
        k = self.cfg.keep_top_k
        if k is None:
            return []
        checkpoints = self.list_checkpoints()
        if not checkpoints:
            return []
        latest_step = checkpoints[-1][0]
        keep = {step for step, _ in self._ranked_best_first()[:k]} | ({latest_step} if exclude_latest else set())
        verified = [step for step, path in checkpoints if path in self._verified]
        if verified and not keep & set(verified):
            keep.add(verified[-1])  # never prune away the only checkpoints known to be whole
        removed = []
        for step, path in checkpoints:
            if step not in keep:
                # Rename first so a crash mid-delete leaves tmp_* debris, never a half-deleted step_N.
                doomed = path.with_name(f"tmp_delete_{path.name}")
                os.rename(path, doomed)
                shutil.rmtree(doomed)
                removed.append(path)
        if removed:
            logger.info("Pruned checkpoints (keep_top_k=%d): %s", k, ", ".join(p.name for p in removed))
        return removed

    def _ranked_best_first(self) -> list[tuple[int, Path]]:
        ranked, missing = rank_best_first(
            self.list_checkpoints(), self.cfg.metric_name, self.cfg.higher_is_better, self.load_training_info
        )
        if missing and not self._warned_missing_metric:
            self._warned_missing_metric = True
            logger.warning(
                "Checkpoints %s have no finite %r in %s; they rank last for keep_top_k",
                missing,
                self.cfg.metric_name,
                TRAINING_INFO_FILE,
            )
        return ranked

    # -- crash recovery -------------------------------------------------------------------------------------------

    def _recover_debris(self) -> None:
        remove_save_debris(self.checkpoint_dir)


class CheckpointsUnusable(UserInputError):
    """Checkpoints exist but none passes its manifest: resuming would load damaged weights."""


def _free_name(path: Path) -> Path:
    """``path``, or ``path.1``, ``path.2``... whichever does not exist yet."""
    candidate, n = path, 0
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


def _as_number(value: Any) -> Any:
    """A one-element numpy array or tensor (or numpy scalar) as its Python number; anything else unchanged."""
    if getattr(value, "size", None) == 1 or (callable(getattr(value, "numel", None)) and value.numel() == 1):
        return value.item()
    return value


def remove_save_debris(checkpoint_dir: Path) -> None:
    """Remove what interrupted saves, replaces or prunes left in ``checkpoint_dir`` (``tmp_*``) and restore a
    ``step_N`` whose re-save was cut between its two renames (``old_step_N``). Complete ``step_N`` stay."""
    if not checkpoint_dir.is_dir():
        return
    for child in sorted(checkpoint_dir.iterdir()):
        if not child.is_dir():
            continue
        if child.name.startswith("tmp_"):
            logger.warning("Removing incomplete checkpoint debris %s (left by an interrupted run)", child)
            shutil.rmtree(child)
        elif (match := _OLD_STEP_RE.match(child.name)) is not None:
            final_dir = checkpoint_dir / f"step_{match.group(1)}"
            if (final_dir / TRAINING_INFO_FILE).is_file():
                logger.warning("Removing %s: its replacement %s is complete", child, final_dir.name)
                shutil.rmtree(child)
            else:
                logger.warning("Restoring %s from %s (a re-save was interrupted)", final_dir.name, child.name)
                if final_dir.exists():
                    shutil.rmtree(final_dir)
                os.rename(child, final_dir)
    fsync_path(checkpoint_dir)


def find_checkpoint_step(path: Path) -> Path | None:
    """The checkpoint step folder ``path`` names: itself (``step_N``), its parent (``step_N/policy``), or the latest
    complete ``step_N`` inside it (a ``checkpoint_dir``); None when ``path`` is no checkpoint. A step folder that
    fails its manifest is a `CheckpointsUnusable` naming the file (`require_verified`)."""
    if _is_step_dir(path):
        return require_verified(path)
    if path.name == "policy" and _is_step_dir(path.parent):
        return require_verified(path.parent)
    steps = [
        (int(m.group(1)), child)
        for child in path.iterdir()
        if (m := _STEP_RE.match(child.name)) and (child / TRAINING_INFO_FILE).is_file() and _is_step_dir(child)
    ]
    return require_verified(max(steps)[1]) if steps else None


def require_verified(step_dir: Path) -> Path:
    """``step_dir`` if it passes its manifest (or predates manifests); else a one-line `CheckpointsUnusable`. Files
    added after the save (an evaluation's converted ``policy/hf``) are not the manifest's business."""
    try:
        problem = verify_checkpoint(step_dir)
    except FileNotFoundError:
        return step_dir  # written before manifests existed
    if problem is not None:
        raise CheckpointsUnusable(f"checkpoint {step_dir} fails verification: {problem}")
    return step_dir


def require_verified_weights(weights: Path) -> None:
    """`require_verified` for the checkpoint a ``step_N/policy/weights`` folder belongs to (nothing for a folder
    outside a checkpoint)."""
    step_dir = weights.resolve().parent.parent
    if (step_dir / TRAINING_INFO_FILE).is_file():
        require_verified(step_dir)


def _is_step_dir(path: Path) -> bool:
    policy = path / "policy"
    return (policy / "weights").is_dir() or (policy / "hf" / "config.json").is_file()
