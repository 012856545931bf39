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

``--workload heavy`` is a generation-heavy variant (8 samples per prompt, up to 512 new tokens, longer sums with a
chain-of-thought prompt) where generation is at least as long as training. Runs go one after another, so keep the
machine otherwise idle.

    uv run --no-sync python benchmarks/async_grpo.py [--steps 5] [--workload main|heavy] [--modes ...]
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


def run(mode: str, workload: str, steps: int, log_dir: Path) -> dict[str, float]:
    config, overrides = MODES[mode]
    command = [sys.executable, "examples/run_grpo_math.py", "--config", config, f"grpo.max_num_steps={steps}"]
    command += [*COMMON, *overrides, *WORKLOADS[workload], f"logger.log_dir={log_dir}"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{mode}: run failed (exit {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    by_step: dict[int, dict[str, float]] = {}
    for line in next(log_dir.glob("exp_*/metrics.jsonl")).read_text().splitlines():
        row = json.loads(line)
        by_step.setdefault(row.pop("step"), {}).update(row)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="steps per run (>= 2: step 1 is not timed)")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="main")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be >= 2")
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
