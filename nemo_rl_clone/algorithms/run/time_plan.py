"""The dry run's time plan: a GRPO step's predicted split (generation, logprob passes, training, weight sync,
validation's share) from the model's shapes, the config's batch and lengths, and this machine's probed rates
(`models.machine_rates`, `models.time_estimate`), for the config's layout and the other one (colocated vs split).

Response lengths and the samples that train are only known once the run samples; the plan states them: the bound
(every response at ``max_new_tokens``, every sample trained) and half of each. ``benchmarks/time_plan.py`` checks
the model against a run with the run's own lengths put in.
"""

from __future__ import annotations

import math
import os
from typing import Any

from nemo_rl_clone.models.machine_rates import MachineRates
from nemo_rl_clone.models.memory_estimate import ModelShape, training_microbatch_tokens
from nemo_rl_clone.models.time_estimate import Layout, Rollout, StepWork, step_time

DEFAULT_MAX_NUM_SEQS = 256  # vLLM's scheduler default when vllm_cfg.max_num_seqs is null
# Published dense bf16 peaks (TFLOP/s) of common training GPUs, printed beside the probe's measured rate.
PUBLISHED_BF16_TFLOPS = {"H200": 989, "H100": 989, "A100": 312, "B200": 2250, "L40S": 362, "A10": 125, "L4": 121}


def has_time_plan(config: Any) -> bool:
    """A step the plan models: rollouts by vLLM engines, then a policy update (GRPO and its variants)."""
    loop = getattr(config, "loop", None)
    generation = getattr(getattr(config, "policy", None), "generation", None)
    return (
        hasattr(loop, "num_generations_per_prompt")
        and generation is not None
        and getattr(generation, "backend", "vllm") == "vllm"
        and not hasattr(config, "value")  # PPO's critic is not modelled
    )


def step_work(
    config: Any,
    prompt_tokens: float,
    response_tokens: float | None = None,
    trained_samples: float | None = None,
    val_rows: int | None = None,
) -> StepWork:
    """A step of ``config`` with these mean lengths (default: the bound, every response at ``max_new_tokens`` per
    turn and every sample trained)."""
    loop, generation = config.loop, config.policy.generation
    turns = float(getattr(loop, "max_rollout_turns", 1) or 1)
    rows = loop.num_prompts_per_step * loop.num_generations_per_prompt
    response = response_tokens if response_tokens is not None else generation.max_new_tokens * turns
    rollout = Rollout(rows, prompt_tokens, response, generation.max_new_tokens, turns)
    validation, batches = None, 0
    period = int(getattr(loop, "val_period", 0) or 0)
    if period > 0 and val_rows:
        total = val_rows * max(int(getattr(loop, "num_val_generations_per_prompt", 1) or 1), 1)
        batch = min(total, int(getattr(loop, "val_batch_size", total) or total))
        validation, batches = (
            Rollout(batch, prompt_tokens, response, generation.max_new_tokens, turns),
            math.ceil(total / batch),
        )
    passes = int(bool(config.needs_reference_model)) + int(bool(getattr(config, "needs_prev_logprobs", False)))
    trained = float(rows if trained_samples is None else trained_samples)
    return StepWork(rollout, trained, passes, validation, batches, period)


def layouts(config: Any, on_gpu: bool) -> list[Layout]:
    """The config's own layout first, then the alternative: colocated, or split (the config's split, else half
    the devices each; sync, or overlapped for async GRPO). On GPU each worker and engine has its devices; on CPU
    the probe measured all cores, which colocated groups take in turns and split ones share out."""
    generation = config.policy.generation
    vllm_cfg = generation.vllm_cfg
    width = vllm_cfg.tensor_parallel_size * vllm_cfg.pipeline_parallel_size
    cluster_devices = config.cluster.gpus_per_node * config.cluster.num_nodes
    resources = generation.colocated.resources
    configured = (resources.gpus_per_node or 0) * (resources.num_nodes or 1)
    if generation.colocated.enabled:
        devices = cluster_devices if on_gpu else (os.cpu_count() or 1)
        engine_devices = configured or max(devices // 2, 1)
        policy_devices = max(devices - engine_devices, 1)
    else:
        engine_devices, policy_devices = max(configured, 1), cluster_devices
    asynchronous = bool(getattr(getattr(config.loop, "async_grpo", None), "enabled", False))
    name = f"split: {engine_devices} for engines, {policy_devices} for training" + (", async" if asynchronous else "")
    if on_gpu:
        colocated = Layout("colocated", cluster_devices, max(cluster_devices // width, 1), width)
        split = Layout(name, policy_devices, max(engine_devices // width, 1), width, overlap=asynchronous)
    else:  # a CPU "device" is a core: each side gets its own (Ray's CPU bundles, one thread each)
        colocated = Layout("colocated")
        split = Layout(name, policy_threads=policy_devices, engine_threads=engine_devices, overlap=asynchronous)
    return [colocated, split] if generation.colocated.enabled else [split, colocated]


class Planner:
    """Predicts steps of one config: the model's shape and the machine's rates per thread count, probed once."""

    def __init__(self, config: Any) -> None:
        from nemo_rl_clone.models.huggingface import resolve_model_path

        self.config = config
        policy = config.policy
        self.shape = ModelShape.of(resolve_model_path(policy.model_name), policy.hf_config_overrides)
        self.vllm_cfg = policy.generation.vllm_cfg
        self.rows = config.loop.num_prompts_per_step * config.loop.num_generations_per_prompt
        self.sources: dict[int, str] = {}
        self._rates: dict[int, MachineRates] = {}

    def rates(self, threads: int) -> MachineRates:
        from nemo_rl_clone.models.machine_rates import machine_rates

        if threads not in self._rates:
            policy = self.config.policy
            self._rates[threads], self.sources[threads] = machine_rates(
                self.shape,
                policy.precision,
                self.vllm_cfg.precision,
                training_microbatch_tokens(policy),
                self.rows,
                threads,
            )
        return self._rates[threads]

    def predict(self, work: StepWork, layout: Layout) -> dict[str, float]:
        return step_time(
            self.shape,
            work,
            layout,
            self.rates(layout.policy_threads),
            self.rates(layout.engine_threads),
            self.vllm_cfg.precision,
            self.vllm_cfg.max_num_seqs or DEFAULT_MAX_NUM_SEQS,
            self.config.policy.dtensor_cfg.logits_at_loss_tokens_only,
        )

    def describe(self) -> str:
        rates = next(iter(self._rates.values()))
        return "; ".join(
            f"{rates.device}, {threads or rates.threads} threads: {source}" for threads, source in self.sources.items()
        ) + _published(rates.device)


def plan_time(config: Any, plan: Any, prompt_tokens: float | None, val_rows: int | None) -> None:
    """Add the time plan's columns to ``plan`` (`dry_run.Plan`): one per layout and length assumption."""
    import torch

    planner = Planner(config)
    bound = step_work(config, prompt_tokens or 0.0, val_rows=val_rows)
    half = step_work(
        config, prompt_tokens or 0.0, bound.rollout.response_tokens / 2, bound.trained_samples / 2, val_rows=val_rows
    )
    for layout in layouts(config, torch.cuda.is_available()):
        for assumption, work in (("bound", bound), ("half", half)):
            plan.times.append((layout.name, assumption, planner.predict(work, layout)))
    plan.time_source = planner.describe()
    if prompt_tokens is None:
        plan.warnings.append("time plan: prompt lengths unknown (no rows templated); prompts counted as empty")


def _published(device: str) -> str:
    for name, tflops in PUBLISHED_BF16_TFLOPS.items():
        if device.startswith("cuda") and name in device:
            return f"; published bf16 peak {tflops} TFLOP/s"
    return ""
