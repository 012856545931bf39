"""Async GRPO against synchronous GRPO, in one invocation: steps per second of three modes on the same prompts,
seeds and number of steps.

Modes (each a whole run of ``--steps`` steps of ``configs/grpo_smollm2_cpu.yaml``, no validation, no checkpoints):
- ``sync_colocated``: the main job as it ships (trainer and engine take turns on all cores).
- ``sync_split``: trainer and engine on a bundle (core) each, taking turns: each phase runs on half the machine
  while the other half waits.
- ``async_split``: the same split, async (``configs/grpo_smollm2_cpu_async.yaml``): the engine generates the next
  step's rollouts while the trainer trains.

Per mode: the median step time over steps 2..N (step 1 carries one-off warm-up), its generation time, and what
the trainer did besides (``train_side`` = step - generation). Then, for the split runs:
- ``efficiency=``: the ideal async step, max(generation, train_side) of ``sync_split``, over the measured
  ``async_split`` step (1.0: the overlap hides the shorter phase entirely);
- ``ratio=``: ``sync_split`` step / ``async_split`` step (steps per second, async over sync);
- ``colocated_ratio=``: ``sync_colocated`` step / ``async_split`` step (above 1: async on split cores beats the
  colocated default).

``--curves MINUTES``: instead, each mode trains for MINUTES of wall clock (``checkpointing.checkpoint_must_save_by``
from the first step; validation at the start and every 5 steps, inside the budget), and the validation accuracy is
printed against the wall clock at which it was measured (step times and validation times summed), with
``accuracy_at_budget=`` per mode; ``--plot PNG`` draws the curves.

``--workload heavy`` is a generation-heavy variant (8 samples per prompt, up to 512 new tokens, longer sums with a
chain-of-thought prompt); ``heavy_lora`` the same with LoRA, whose cheaper training leaves generation the longer
phase. Runs go one after another, so keep the
machine otherwise idle.

    uv run --no-sync python benchmarks/async_grpo.py [--steps 5] [--workload main|heavy] [--modes ...]
    uv run --no-sync python benchmarks/async_grpo.py --curves 10 --plot docs/async_grpo_curves.png
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMON = [
    "grpo.val_at_start=false",
    "grpo.val_period=0",
    "checkpointing.enabled=false",
    "logger.wandb_enabled=false",
    "logger.tensorboard_enabled=false",
]
SPLIT = [
    "policy.generation.colocated.enabled=false",
    "policy.generation.colocated.resources.gpus_per_node=1",
    "policy.generation.colocated.resources.num_nodes=1",
]
MODES = {
    "sync_colocated": ("configs/grpo_smollm2_cpu.yaml", []),
    "sync_split": ("configs/grpo_smollm2_cpu.yaml", SPLIT),
    "async_split": ("configs/grpo_smollm2_cpu_async.yaml", []),
}
WORKLOADS = {
    "main": [],
    "heavy": [
        "grpo.num_prompts_per_step=2",
        "grpo.num_generations_per_prompt=8",
        "policy.train_global_batch_size=16",
        "policy.generation.max_new_tokens=512",
        "policy.max_total_sequence_length=768",
        "policy.generation.vllm_cfg.max_model_len=768",
        "data.prompt_file=examples/prompts/cot.txt",
        "data.reasoning_gym.task_kwargs.min_terms=4",
        "data.reasoning_gym.task_kwargs.max_terms=6",
        "data.reasoning_gym.task_kwargs.max_digits=3",
    ],
}
# The same with LoRA (rank 8 on every linear layer, lr 2e-4): the trainer computes no weight gradients of the base
# model, so training gets cheaper while generation costs the same (merged weights are served).
WORKLOADS["heavy_lora"] = [
    *WORKLOADS["heavy"],
    "policy.dtensor_cfg.lora_cfg.enabled=true",
    "policy.optimizer.kwargs.lr=2e-4",
]


def read_steps(log_dir: Path) -> dict[int, dict[str, float]]:
    """The run's ``metrics.jsonl`` (its one ``exp_*`` folder in ``log_dir``), merged per step."""
    by_step: dict[int, dict[str, float]] = {}
    for line in next(log_dir.glob("exp_*/metrics.jsonl")).read_text().splitlines():
        row = json.loads(line)
        by_step.setdefault(row.pop("step"), {}).update(row)
    return by_step


def run(mode: str, workload: str, steps: int, log_dir: Path) -> dict[str, float]:
    config, overrides = MODES[mode]
    command = [sys.executable, "examples/run_grpo_math.py", "--config", config, f"grpo.max_num_steps={steps}"]
    command += [*COMMON, *overrides, *WORKLOADS[workload], f"logger.log_dir={log_dir}"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{mode}: run failed (exit {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    by_step = read_steps(log_dir)
    timed = [metrics for step, metrics in sorted(by_step.items()) if step >= 2]

    def median(key: str) -> float:
        return statistics.median(m[key] for m in timed)

    summary = {"step": median("timing/train/total_step_time"), "generation": median("timing/train/generation")}
    summary["train_side"] = statistics.median(
        m["timing/train/total_step_time"] - m["timing/train/generation"] for m in timed
    )
    summary["policy_training"] = median("timing/train/policy_training")
    for key in ("wait_for_rollouts", "wait_for_engines", "engine_idle"):
        if f"timing/train/{key}" in timed[0]:
            summary[key] = median(f"timing/train/{key}")
    for key in ("async/trajectory_age_max", "train/token_mult_prob_error", "train/reward"):
        if key in timed[0]:
            summary[key.split("/")[-1]] = median(key)
    summary["generated_tokens"] = median("train/generated_tokens")
    return summary


def curve(mode: str, minutes: int, workdir: Path) -> list[tuple[float, int, float]]:
    """(wall-clock minutes since the first step, step, validation accuracy) of a run of ``mode`` cut at ``minutes``."""
    config, overrides = MODES[mode]
    command = [sys.executable, "examples/run_grpo_math.py", "--config", config, *overrides]
    command += [
        "grpo.val_at_start=true",
        "grpo.val_period=5",
        "logger.wandb_enabled=false",
        "logger.tensorboard_enabled=false",
        "checkpointing.save_period=1000",
        f"checkpointing.checkpoint_must_save_by=00:00:{minutes:02d}:00",
        f"checkpointing.checkpoint_dir={workdir / 'ckpt'}",
        f"logger.log_dir={workdir / 'logs'}",
    ]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{mode}: run failed (exit {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    by_step = read_steps(workdir / "logs")
    points, elapsed = [], by_step[0].get("timing/validation/total_validation_time", 0.0)
    points.append((elapsed / 60, 0, by_step[0]["validation/accuracy"]))
    for step in sorted(s for s in by_step if s > 0):
        elapsed += by_step[step]["timing/train/total_step_time"]  # includes the step's validation
        if "validation/accuracy" in by_step[step]:
            points.append((elapsed / 60, step, by_step[step]["validation/accuracy"]))
    return points


def plot(curves: dict[str, list[tuple[float, int, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for mode, points in curves.items():
        ax.plot([p[0] for p in points], [p[2] for p in points], marker="o", label=mode)
    ax.set_xlabel("wall clock since the first step (min)")
    ax.set_ylabel("validation accuracy (96 problems)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="steps per run (>= 2: step 1 is not timed)")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="main")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--curves", type=int, metavar="MINUTES", help="accuracy against wall clock instead")
    parser.add_argument("--plot", type=Path, help="with --curves: write the curves to this PNG")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be >= 2")
    if args.curves:
        curves = {}
        with tempfile.TemporaryDirectory(prefix="async_grpo_curves_") as tmp:
            for mode in args.modes:
                curves[mode] = curve(mode, args.curves, Path(tmp) / mode)
                print(f"{mode:15s} " + " ".join(f"{m:.1f}min/step{s}:{a:.3f}" for m, s, a in curves[mode]), flush=True)
        for mode, points in curves.items():
            print(f"{mode}: accuracy_at_budget={points[-1][2]:.3f} steps={points[-1][1]}")
        if args.plot:
            plot(curves, args.plot)
        return
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="async_grpo_") as tmp:
        for mode in args.modes:
            results[mode] = run(mode, args.workload, args.steps, Path(tmp) / mode)
            print(f"{mode:15s} " + " ".join(f"{k}={v:.4g}" for k, v in results[mode].items()), flush=True)
    if "sync_split" in results and "async_split" in results:
        sync, async_ = results["sync_split"], results["async_split"]
        ideal = max(sync["generation"], sync["train_side"])
        print(f"ideal_async_step={ideal:.4g}")
        print(f"efficiency={ideal / async_['step']:.2f}")
        print(f"ratio={sync['step'] / async_['step']:.2f}")
        if "sync_colocated" in results:
            print(f"colocated_ratio={results['sync_colocated']['step'] / async_['step']:.2f}")


if __name__ == "__main__":
    main()
