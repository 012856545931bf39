"""The dry run's time plan against a run: runs a GRPO config for ``--steps`` steps (or reads a finished run's logs
with ``--log-dir``), then predicts each step with the run's own lengths put in — its mean prompt and response
lengths, its turns, the samples that trained and their responses (from the ``train_data_step*.jsonl`` dumps) —
and this machine's probed rates, and prints predicted against measured medians per phase (steps 2..N; steps with a
validation or a checkpoint are left out of the step's median, validation is compared on its own).

Prints ``step_error=<predicted/measured - 1>`` last, and before it the plan the dry run printed beforehand (its
"bound" and "half" rows) beside the measured median: what a user would have been told.

    uv run --no-sync python benchmarks/time_plan.py [--config configs/grpo_smollm2_cpu.yaml] [--steps 10]
        [--entry examples/run_grpo_math.py] [--log-dir logs/.../exp_1 | --keep DIR] [overrides ...]
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
MEASURED = {
    "generation": "timing/train/generation",
    "logprobs": "timing/train/policy_and_reference_logprobs",
    "training": "timing/train/policy_training",
    "weight_sync": "timing/train/weight_sync",
}


def run(entry: str, config: str, steps: int, log_dir: Path, overrides: list[str]) -> Path:
    command = [sys.executable, entry, "--config", config, f"grpo.max_num_steps={steps}"]
    command += ["checkpointing.enabled=false", "logger.wandb_enabled=false", f"logger.log_dir={log_dir}", *overrides]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"run failed (exit {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return next(log_dir.glob("exp_*"))


def by_step(run_dir: Path) -> dict[int, dict[str, float]]:
    steps: dict[int, dict[str, float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        steps.setdefault(int(row["step"]), {}).update(row)
    return steps


def trained(run_dir: Path, step: int, metrics: dict[str, float]) -> tuple[float, float]:
    """(samples that trained, their mean response tokens): from the step's dump, else the logged count and the mean
    over all samples."""
    dump = run_dir / f"train_data_step{step}.jsonl"
    if dump.exists():
        samples = [json.loads(line) for line in dump.read_text().splitlines()]
        kept = [s for s in samples if s.get("advantage", 0.0) != 0.0]
        if kept:
            return float(len(kept)), statistics.mean(len(s["tokens"]) for s in kept)
        return 0.0, 0.0
    return metrics["train/num_trained_samples"], metrics["train/rollout/mean_generation_length"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/grpo_smollm2_cpu.yaml")
    parser.add_argument("--entry", default="examples/run_grpo_math.py")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--log-dir", type=Path, help="a finished run's exp_N folder: compare it, run nothing")
    parser.add_argument("--keep", type=Path, help="run into this log folder and keep it (default: a temporary one)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    from nemo_rl_clone.algorithms import registry
    from nemo_rl_clone.algorithms.run.time_plan import Planner, layouts, step_work
    from nemo_rl_clone.models.time_estimate import PHASES, Rollout, StepWork, step_total
    from nemo_rl_clone.utils.config import load_validated_config

    with tempfile.TemporaryDirectory(prefix="time_plan_") as tmp:
        run_dir = args.log_dir or run(args.entry, args.config, args.steps, args.keep or Path(tmp), args.overrides)
        config = load_validated_config(run_dir / "config.yaml", [], registry.config_class("grpo"))
        steps = by_step(run_dir)
    planner = Planner(config)
    layout = layouts(config, on_gpu=False)[0]
    rows, max_new = planner.rows, config.policy.generation.max_new_tokens
    predicted: dict[str, list[float]] = {phase: [] for phase in (*PHASES, "step")}
    measured: dict[str, list[float]] = {phase: [] for phase in (*PHASES, "step")}
    prompts = []
    for step, metrics in sorted(steps.items()):
        if step < 2 or "train/mean_prompt_length" not in metrics:
            continue
        prompt = metrics["train/mean_prompt_length"]
        prompts.append(prompt)
        response = metrics["train/rollout/mean_generation_length"]
        turns = metrics.get("train/rollout/mean_turns", 1.0)
        samples, trained_response = trained(run_dir, step, metrics)
        passes = step_work(config, prompt).logprob_passes
        rollout = Rollout(rows, prompt, response, max_new, turns)
        times = planner.predict(StepWork(rollout, 0.0, passes), layout)
        training = planner.predict(
            StepWork(Rollout(rows, prompt, trained_response, max_new, turns), samples, 0), layout
        )
        times["training"] = training["training"] if samples else 0.0
        times["step"] = step_total(times, layout)
        quiet = "timing/validation/total_validation_time" not in metrics and "timing/train/checkpointing" not in metrics
        for phase, key in MEASURED.items():
            if key in metrics:
                predicted[phase].append(times[phase])
                measured[phase].append(metrics[key])
        if quiet:
            predicted["step"].append(times["step"])
            measured["step"].append(metrics["timing/train/total_step_time"])
    print(f"rates: {planner.describe()}; layout: {layout.name}")
    for phase in (*PHASES, "step"):
        if measured[phase]:
            p, m = statistics.median(predicted[phase]), statistics.median(measured[phase])
            print(f"{phase:12s} predicted {p:7.2f} s  measured {m:7.2f} s  ({len(measured[phase])} steps)")
    validations = [
        m["timing/validation/total_validation_time"]
        for m in steps.values()
        if "timing/validation/total_validation_time" in m
    ]
    lengths = [m["validation/avg_length"] for m in steps.values() if "validation/avg_length" in m]
    if validations and lengths:
        val_rows = config.loop.max_val_samples
        work = step_work(config, statistics.median(prompts), statistics.median(lengths), val_rows=val_rows)
        times = planner.predict(work, layout)
        print(f"validation   predicted {times['validation']:7.2f} s  measured {statistics.median(validations):7.2f} s")
    if not measured["step"]:
        sys.exit("no step without validation or checkpoint after step 1: run more steps")
    step_measured = statistics.median(measured["step"])
    bound = step_work(config, statistics.median(prompts))
    half = step_work(config, statistics.median(prompts), bound.rollout.response_tokens / 2, bound.trained_samples / 2)
    for name, work in (("bound", bound), ("half", half)):
        planned = planner.predict(work, layout)["step"]
        print(f"dry run's {name:5s} plan {planned:7.2f} s  ({planned / step_measured - 1:+.0%} of the measured step)")
    print(f"step_error={statistics.median(predicted['step']) / step_measured - 1:+.3f}")


if __name__ == "__main__":
    main()
