"""Helpers of the functional tests: run an entry point as a real process, read its metrics, write small data files
in the real formats."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def run_entry_point(
    algorithm: str, workdir: Path, *overrides: str, timeout: int = 600, config: str | None = None
) -> subprocess.CompletedProcess:
    """``examples/run_{algorithm}.py --config configs/{config or algorithm_smoke.yaml}`` with logs and checkpoints
    in ``workdir``; asserts exit code 0."""
    args = [sys.executable, str(REPO / "examples" / f"run_{algorithm}.py"),
            "--config", str(REPO / "configs" / (config or f"{algorithm}_smoke.yaml")),
            f"logger.log_dir={workdir / 'logs'}", f"checkpointing.checkpoint_dir={workdir / 'ckpt'}", *overrides]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=workdir)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def read_metrics(log_dir: Path) -> dict[int, dict[str, float]]:
    """``metrics.jsonl`` of a run directory, merged per step."""
    steps: dict[int, dict[str, float]] = {}
    for line in (log_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        steps.setdefault(row.pop("step"), {}).update(row)
    return steps


def run_dirs(workdir: Path) -> list[Path]:
    """The ``exp_N`` log directories of ``workdir``, in run order."""
    return sorted((workdir / "logs").iterdir(), key=lambda p: int(p.name.split("_")[1]))


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def assert_checkpoint(step_dir: Path) -> None:
    """A complete ``step_N``: training info, weights, optimizer, tokenizer, dataloader + RNG state."""
    for name in ("training_info.json", "config.yaml", "train_dataloader.pt", "policy/weights", "policy/optimizer",
                 "policy/tokenizer"):
        assert (step_dir / name).exists(), f"{step_dir / name} is missing"
