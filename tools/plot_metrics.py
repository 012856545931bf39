"""Plot a run's learning curve from its ``metrics.jsonl``: validation accuracy and training reward per step; or,
with ``--against``, several runs' validation accuracy against wall-clock minutes since their process started.

uv run tools/plot_metrics.py logs/grpo_smollm2_cpu/exp_1/metrics.jsonl docs/grpo_smollm2_cpu.png
uv run tools/plot_metrics.py logs/grpo_smollm2_cpu/exp_1/metrics.jsonl docs/ppo_vs_grpo.png --title "..." \
    --label GRPO --against PPO=logs/ppo_smollm2_cpu/exp_1/metrics.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt


def read_series(path: Path, key: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if key in row:
            steps.append(row["step"])
            values.append(row[key])
    return steps, values


def elapsed_minutes(path: Path) -> dict[int, float]:
    """Minutes from the process start to the end of each step: ``timing/train/startup_time`` (imports, Ray, workers,
    validation at the start) plus every step's ``total_step_time`` so far (which holds its validation and save)."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    start = next((r["timing/train/startup_time"] for r in rows if "timing/train/startup_time" in r), 0.0)
    ends, total = {0: start / 60}, start
    for row in rows:
        if "timing/train/total_step_time" in row:
            total += row["timing/train/total_step_time"]
            ends[row["step"]] = total / 60
    return ends


def plot_against_time(runs: list[tuple[str, Path]], out: Path, title: str) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, path in runs:
        minutes = elapsed_minutes(path)
        steps, values = read_series(path, "validation/accuracy")
        ax.plot([minutes[s] for s in steps], values, "o-", label=f"{label} (validation accuracy)")
    ax.set_xlabel("minutes since the process started")
    ax.set_ylabel("fraction correct")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--title", default="GRPO")
    parser.add_argument("--label", default="run", help="the first run's name in --against plots")
    parser.add_argument("--against", action="append", default=[], metavar="LABEL=METRICS_JSONL")
    args = parser.parse_args()
    if args.against:
        others = [(spec.partition("=")[0], Path(spec.partition("=")[2])) for spec in args.against]
        plot_against_time([(args.label, args.metrics), *others], args.out, args.title)
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, style in (("validation/accuracy", "o-"), ("train/accuracy", "-"), ("train/reward", ":")):
        steps, values = read_series(args.metrics, key)
        if steps:
            ax.plot(steps, values, style, label=key, alpha=1.0 if key.startswith("validation") else 0.6)
    ax.set_xlabel("step")
    ax.set_ylabel("fraction correct / mean reward")
    ax.set_title(args.title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
