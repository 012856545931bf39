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
    args = [
        sys.executable,
        str(REPO / "examples" / f"run_{algorithm}.py"),
        "--config",
        str(REPO / "configs" / (config or f"{algorithm}_smoke.yaml")),
        f"logger.log_dir={workdir / 'logs'}",
        f"checkpointing.checkpoint_dir={workdir / 'ckpt'}",
        *overrides,
    ]
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
    for name in (
        "training_info.json",
        "config.yaml",
        "train_dataloader.pt",
        "policy/weights",
        "policy/optimizer",
        "policy/tokenizer",
    ):
        assert (step_dir / name).exists(), f"{step_dir / name} is missing"


# Four fixed preference pairs the DPO and reward-model tests learn.
PAIRS = [
    ("What is 2 + 3?", "2 + 3 = 5.", "I refuse to answer that."),
    ("Name a primary colour.", "Red is a primary colour.", "Colours are not real."),
    ("What do bees make?", "Bees make honey.", "Bees make nothing at all, ever."),
    ("How many legs does a spider have?", "A spider has eight legs.", "Spiders have wheels."),
]


def pair_overrides(workdir: Path, section: str) -> list[str]:
    """Overrides that train ``section`` (``dpo`` / ``rm``) on :data:`PAIRS`, all 4 in every step, validating on them
    at the start and every 2 steps."""
    rows = [{"prompt": prompt, "chosen": chosen, "rejected": rejected} for prompt, chosen, rejected in PAIRS]
    path = write_jsonl(workdir / "pairs.jsonl", rows)
    return [
        "data.dataset_name=binary_preference",
        f"data.data_path={path}",
        f"data.val_data_path={path}",
        f"{section}.max_num_epochs=100",
        "policy.train_global_batch_size=4",
        "policy.train_micro_batch_size=2",
        f"{section}.val_at_start=true",
        f"{section}.val_period=2",
        f"{section}.val_global_batch_size=4",
        f"{section}.val_micro_batch_size=2",
    ]


def run_cut_and_resumed(algorithm: str, workdir: Path, *overrides: str) -> dict[int, dict[str, float]]:
    """Run 4 steps, check the checkpoints, restart to 6 steps; the two runs' metrics merged per step (the restart
    must have resumed from step 4 and logged training steps 5 and 6 only)."""
    run_entry_point(algorithm, workdir, *overrides, f"{algorithm}.max_num_steps=4")
    assert sorted(p.name for p in (workdir / "ckpt").iterdir()) == ["step_1", "step_2", "step_3", "step_4"]
    assert_checkpoint(workdir / "ckpt" / "step_4")
    proc = run_entry_point(algorithm, workdir, *overrides, f"{algorithm}.max_num_steps=6")
    assert "Resuming from checkpoint" in proc.stdout and "step_4 (step 4)" in proc.stdout
    first, second = (read_metrics(d) for d in run_dirs(workdir))
    assert sorted(s for s in second if "train/loss" in second[s]) == [5, 6]
    return {**first, **second}
