"""GRPO step time of the main job's configuration (``uv run examples/run_grpo_math.py``) with today's defaults vs the
old ones, in one invocation.

Modes (each a whole run of ``--steps`` steps, no validation, no checkpoints, same prompts and seeds):
- ``old``: the defaults before the engine ran compiled (2026-11-29): vLLM eager
  (``policy.generation.vllm_cfg.enforce_eager=true``) with vLLM's own sampler (``vllm_cfg.sampler=vllm``). Earlier levers (the LM-head shortcut, sequence packing, the bf16
  backward, training only samples with a gradient) were measured against their own baselines: docs/grpo.md#step-time.
- ``new``: the defaults (only samples with a non-zero advantage train; the update is the same).
- ``inverse_cdf`` (with ``--sampler``): the defaults with the inverse-CDF sampler in place of vLLM's; the two draw
  different samples from the same distributions, so their responses' lengths, and the step's work, differ too.
- ``dynamic`` (with ``--packing``): the defaults with dynamic batching in place of sequence packing (each
  microbatch's samples run as one row, no padding), same token budgets; ``train_padding_fraction`` shows what each
  computes in vain, and ``packing_ratio=<dynamic/new step time>`` what packing buys.
- ``data_plane`` (with ``--data-plane``): the defaults with ``data_plane.enabled`` (the trainer's rows through
  TransferQueue, docs/data_plane.md): the same computations, so ``data_plane_ratio=<data_plane/new step time>`` and
  the two startups are what the queue costs on one machine.
- ``bf16_backward`` (with ``--bf16``): the defaults with the bf16 backward forced (``bfloat16``, not ``auto``): the
  same as ``new`` on a CPU with native bf16, emulated and slower on one without.
- ``bf16`` (with ``--bf16``): the defaults plus bf16 policy (FSDP2 mixed precision: bf16 compute, fp32 master weights
  and optimizer state, fp32 log-softmax), bf16 engine and eager attention. Faster on CPUs with native bf16, but the
  trainer-vs-engine logprob agreement (``token_mult_prob_error``) is reported beside it because it is worse.

Step and phase times are medians over steps 2..N (step 1 carries one-off warm-up); ``startup`` is the seconds from the
process's start to its first step (imports, Ray, engine, policy, data: ``timing/train/startup_time``). Prints a line per mode, then
``ratio=<old/new step time>`` (and ``sampler_ratio``: new over inverse_cdf; ``bf16_backward_ratio``, ``bf16_ratio``: old
over those) last. Runs go one after another, so keep the machine
otherwise idle; ``--rounds 2`` alternates the modes twice and keeps each mode's faster round.

    uv run --no-sync python benchmarks/grpo_step.py [--steps 6] [--rounds 1] [--packing] [--bf16] [--sampler] [--data-plane]
        [--modes new,data_plane]
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
DYNAMIC_BATCHING = [
    "policy.sequence_packing.enabled=false",
    "policy.dynamic_batching.enabled=true",
    "policy.dynamic_batching.train_mb_tokens=${policy.sequence_packing.train_mb_tokens}",
    "policy.dynamic_batching.logprob_mb_tokens=${policy.sequence_packing.logprob_mb_tokens}",
]
MODES = {
    "old": ["policy.generation.vllm_cfg.enforce_eager=true", "policy.generation.vllm_cfg.sampler=vllm"],
    "new": [],
    "inverse_cdf": ["policy.generation.vllm_cfg.sampler=inverse_cdf"],
    "data_plane": ["++data_plane.enabled=true"],
    "dynamic": DYNAMIC_BATCHING,
    "bf16_backward": ["policy.dtensor_cfg.backward_precision=bfloat16"],
    "bf16": [
        "policy.precision=bfloat16",
        "policy.generation.vllm_cfg.precision=bfloat16",
        "policy.dtensor_cfg.attn_implementation=eager",
    ],
}
PHASES = (
    "generation",
    "policy_and_reference_logprobs",
    "policy_training",
    "weight_sync",
    "policy_forward",
    "policy_backward",
    "policy_optimizer",
)


def run(mode: str, steps: int, log_dir: Path) -> dict[str, float]:
    command = [sys.executable, "examples/run_grpo_math.py", f"grpo.max_num_steps={steps}", *COMMON, *MODES[mode]]
    command.append(f"logger.log_dir={log_dir}")
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{mode}: run failed (exit {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    rows = [json.loads(line) for line in next(log_dir.glob("exp_*/metrics.jsonl")).read_text().splitlines()]
    by_step: dict[int, dict[str, float]] = {}
    for row in rows:
        by_step.setdefault(row["step"], {}).update(row)
    timed = [metrics for step, metrics in sorted(by_step.items()) if step >= 2] or list(by_step.values())
    summary = {"step": statistics.median(m["timing/train/total_step_time"] for m in timed)}
    for phase in PHASES:
        values = [m[f"timing/train/{phase}"] for m in timed if f"timing/train/{phase}" in m]
        if values:
            summary[phase] = statistics.median(values)
    startup = [row["timing/train/startup_time"] for row in rows if "timing/train/startup_time" in row]
    if startup:
        summary["startup"] = startup[0]
    for key in (
        "train/num_trained_samples",
        "train/token_mult_prob_error",
        "performance/train_gflops",
        "performance/train_padding_fraction",
        "performance/decode_tokens_per_sec",
    ):
        values = [m[key] for m in timed if key in m]
        if values:
            summary[key.split("/")[-1]] = statistics.median(values)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="steps per run (>= 2: step 1 is not timed)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--packing", action="store_true", help="also run the dynamic-batching mode")
    parser.add_argument("--bf16", action="store_true", help="also run the bf16 modes")
    parser.add_argument("--sampler", action="store_true", help="also run the defaults with the inverse-CDF sampler")
    parser.add_argument("--data-plane", action="store_true", help="also run the defaults through the data plane")
    parser.add_argument("--modes", help="comma-separated modes to run instead (e.g. new,data_plane)")
    args = parser.parse_args()
    modes = ["old", "new", *(["inverse_cdf"] if args.sampler else []), *(["dynamic"] if args.packing else [])]
    modes += ["data_plane"] if args.data_plane else []
    modes = args.modes.split(",") if args.modes else modes
    modes += ["bf16_backward", "bf16"] if args.bf16 else []
    best: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="grpo_step_") as tmp:
        for round_index in range(args.rounds):
            for mode in modes:
                summary = run(mode, args.steps, Path(tmp) / f"{mode}_{round_index}")
                if mode not in best or summary["step"] < best[mode]["step"]:
                    best[mode] = summary
    for mode in modes:
        print(f"{mode:13s} " + " ".join(f"{key}={value:.4g}" for key, value in best[mode].items()))
    if "dynamic" in best:
        print(f"packing_ratio={best['dynamic']['step'] / best['new']['step']:.2f}")
    if "data_plane" in best:
        print(f"data_plane_ratio={best['data_plane']['step'] / best['new']['step']:.2f}")
    if "inverse_cdf" in best:
        print(f"sampler_ratio={best['new']['step'] / best['inverse_cdf']['step']:.2f}")
    if "old" in best:
        for mode in ("bf16_backward", "bf16"):
            if mode in best:
                print(f"{mode}_ratio={best['old']['step'] / best[mode]['step']:.2f}")
        if "new" in best:
            print(f"ratio={best['old']['step'] / best['new']['step']:.2f}")


if __name__ == "__main__":
    main()
