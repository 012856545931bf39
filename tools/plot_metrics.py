"""Plot a run's learning curve from its ``metrics.jsonl``: validation accuracy and training reward per step.

uv run tools/plot_metrics.py logs/grpo_smollm2_cpu/exp_1/metrics.jsonl docs/grpo_smollm2_cpu.png
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--title", default="GRPO")
    args = parser.parse_args()
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
