"""`benchmarks/train_mfu.py` end to end on CPU with a tiny model: it is what a GPU machine runs first (docs/gpu.md),
so its plumbing (child processes, the worker in-process, the profile → MFU arithmetic) is checked where CI can."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIELDS = {"step_s", "tokens_per_s", "tflops", "mfu", "forward_s", "backward_s", "optimizer_s", "step_s_spread"}


def test_train_mfu_prints_both_precisions_and_their_ratio() -> None:
    peak_tflops = 0.5
    command = [sys.executable, str(REPO / "benchmarks" / "train_mfu.py"), "--model", "tiny-random-llama"]
    command += ["--samples", "4", "--seq-len", "96", "--train-mb-tokens", "256", "--steps", "2", "--warmup", "1"]
    command += ["--peak-tflops", str(peak_tflops)]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    rows = {}
    for line in lines[:-1]:
        precision, *pairs = line.split()
        rows[precision] = {key: float(value) for key, value in (pair.split("=") for pair in pairs)}
    assert set(rows) == {"bfloat16", "float32"}
    for row in rows.values():
        assert row.keys() >= FIELDS
        assert row["step_s"] > 0 and row["tokens_per_s"] > 0
        # MFU is the achieved model FLOP/s over the given peak.
        assert row["mfu"] == pytest.approx(row["tflops"] / peak_tflops, rel=2e-3)  # both printed to 4 digits
        assert row["forward_s"] + row["backward_s"] + row["optimizer_s"] <= row["step_s"]
    ratio = float(lines[-1].removeprefix("bf16_over_fp32="))
    assert ratio == pytest.approx(rows["float32"]["step_s"] / rows["bfloat16"]["step_s"], abs=0.006)  # printed .2f


def test_train_mfu_refuses_an_unknown_precision() -> None:
    command = [sys.executable, str(REPO / "benchmarks" / "train_mfu.py"), "--precisions", "bfloat16,fp8"]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "--precisions: unknown ['fp8']; choose from bfloat16, float32"
