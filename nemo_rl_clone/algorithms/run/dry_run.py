"""``--dry-run``: everything a run would check before training, a memory plan and a time plan, with no Ray, no
engine and no run directory.

    uv run examples/run_grpo_math.py --dry-run [--config ...] [overrides ...]

In order: the config (validated by the CLI already), `preflight` (model and data sources, directories writable,
cluster.* against this machine or the running Ray cluster, optimizer), the tokenizer and the data (train and
validation sizes, the first rows templated against ``max_input_seq_length``), the chat template's append-only
property for multi-turn rollouts, the memory each worker will hold at its peak against this machine's RAM (or
the GPU's memory), and for GRPO-style runs a step's time per phase (`time_plan`: this machine's rates, probed and
cached in ``~/.cache/nemo_rl_clone``, the one file a dry run may write). Prints the plan and returns; every failure is one line (`UserInputError`: exit code 2).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from nemo_rl_clone.algorithms import registry
from nemo_rl_clone.models.memory_estimate import (
    COLUMNS,
    ModelShape,
    WorkerMemory,
    engine_kv_cache_tokens,
    engine_workers,
    inference_worker_memory,
    megatron_worker_memory,
    policy_worker_memory,
    refit_bytes,
)
from nemo_rl_clone.models.policy.backends import backend_spec
from nemo_rl_clone.utils.errors import UserInputError

logger = logging.getLogger(__name__)
FIRST_ROWS = 8  # templated to check their lengths: a second or two, whatever the dataset's size


@dataclass
class Plan:
    """What a dry run found: facts to print, warnings, problems (each one line) and the memory per worker."""

    facts: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    workers: list[WorkerMemory] = field(default_factory=list)
    memory_name: str = ""
    memory_bytes: int = 0
    prompt_tokens: float | None = None  # the first rows' mean templated length
    val_rows: int | None = None
    times: list[tuple[str, str, dict[str, float]]] = field(default_factory=list)  # (layout, assumption, phases)
    time_source: str = ""


def dry_run(config: Any) -> Plan:
    """Check ``config`` as a run would and print its plan; raises `UserInputError` (one line per problem)."""
    from nemo_rl_clone.algorithms.run.preflight import preflight

    preflight(config)  # its problems first: a missing model or data file makes the rest meaningless
    plan = Plan()
    tokenizer = _tokenizer(config, plan)
    if tokenizer is not None:
        _data(config, tokenizer, plan)
        _chat_template(config, tokenizer, plan)
    plan_memory(config, plan)
    _plan_time(config, plan)
    print_plan(plan)
    if plan.problems:
        raise UserInputError(*plan.problems)
    return plan


def _tokenizer(config: Any, plan: Plan) -> Any:
    policy = getattr(config, "policy", None)
    if policy is not None:
        section, model = policy.tokenizer, policy.model_name
    elif hasattr(config, "tokenizer"):  # an evaluation
        section, model = config.tokenizer, _eval_model(config)
    else:
        return None  # a plug-in algorithm that trains no language model
    if section.name is None and model is None:
        return None
    try:
        tokenizer = section.load(model)
    except OSError as error:  # not downloadable (offline) or not a tokenizer folder
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        plan.problems.append(f"tokenizer: cannot load {section.name or model!r}: {first_line}")
        return None
    plan.facts.append(("tokenizer", f"{section.name or model} (vocabulary {len(tokenizer)})"))
    return tokenizer


def _data(config: Any, tokenizer: Any, plan: Plan) -> None:
    train, validation, max_length = _datasets(config, tokenizer)
    if train is None:
        return
    plan.facts.append(("data", f"{len(train)} training rows, {len(validation) if validation else 0} validation rows"))
    max_val = getattr(getattr(config, "loop", None), "max_val_samples", None)
    plan.val_rows = min(len(validation), max_val or len(validation)) if validation else 0
    rows = [train[i] for i in range(min(FIRST_ROWS, len(train)))]  # templates them, as the first step will
    lengths = [int(row["length"]) for row in rows if "length" in row]
    if not lengths:
        return
    plan.prompt_tokens = sum(lengths) / len(lengths)
    plan.facts.append(("first rows", f"{len(rows)} templated, longest {max(lengths)} tokens (limit {max_length})"))
    truncated = sum(float(row.get("loss_multiplier", 1.0)) == 0.0 for row in rows)
    if truncated:
        plan.warnings.append(
            f"data: {truncated} of the first {len(rows)} rows exceed max_input_seq_length={max_length} and are "
            "truncated out of the loss; raise it or filter the data"
        )


def _datasets(config: Any, tokenizer: Any) -> tuple[Any, Any, int | None]:
    """(train, validation, length limit) as the run's setup builds them; (None, None, None) for evaluation."""
    algorithm = registry.algorithm_for(config)
    return (None, None, None) if algorithm is None else algorithm.datasets(config, tokenizer)


def _chat_template(config: Any, tokenizer: Any, plan: Plan) -> None:
    from nemo_rl_clone.data.chat_template_check import check_append_only

    if not getattr(tokenizer, "chat_template", None):
        plan.facts.append(("chat template", "none (plain-text prompts)"))
        return
    policy = getattr(config, "policy", None)
    section = (policy or config).tokenizer
    name = section.name or (policy.model_name if policy is not None else _eval_model(config))
    problem = check_append_only(tokenizer, chat_template_kwargs=section.chat_template_kwargs, name=name)
    if problem is None:
        plan.facts.append(("chat template", "append-only over 3 turns (multi-turn rollouts keep their tokens)"))
    elif _multi_turn(config):
        plan.problems.append(problem)
    else:
        plan.warnings.append(f"{problem} (this run is single-turn: fine here)")


def _multi_turn(config: Any) -> bool:
    algorithm = registry.algorithm_for(config)
    return algorithm is not None and algorithm.multi_turn(config)


def plan_memory(config: Any, plan: Plan) -> None:
    """Add the workers' planned peaks to ``plan`` and check them against this machine's RAM or GPU memory."""
    import torch

    from nemo_rl_clone.models.huggingface import resolve_model_path

    on_gpu = torch.cuda.is_available()
    device_bytes = torch.cuda.get_device_properties(0).total_memory if on_gpu else None
    if on_gpu:
        plan.memory_name, plan.memory_bytes = f"GPU memory ({torch.cuda.get_device_name(0)})", int(device_bytes or 0)
    else:
        plan.memory_name, plan.memory_bytes = "RAM", _ram_bytes()
    policy = getattr(config, "policy", None)
    workers = config.cluster.gpus_per_node  # per node
    if policy is not None:
        shape = ModelShape.of(resolve_model_path(policy.model_name), policy.hf_config_overrides)
        plan.facts.append(("model", f"{policy.model_name}: {shape.num_parameters / 1e6:.1f} M parameters"))
        shards = workers * config.cluster.num_nodes
        algorithm = registry.algorithm_for(config)
        reference = algorithm is not None and algorithm.needs_reference_model(config)
        generation: Any = getattr(policy, "generation", None)
        has_engines = generation is not None and getattr(generation, "vllm_cfg", None) is not None
        refit = refit_bytes(generation.vllm_cfg, shape, generation.colocated.enabled, on_gpu) if has_engines else 0
        backend = backend_spec(policy)
        if not backend.calibrated_memory:
            plan.warnings.append(
                f"memory: the {backend.title} worker's plan is computed from its parallel layout, not calibrated on "
                "measured runs (the DTensor worker's is)"
            )
        if backend.section == "megatron_cfg":
            plan.workers.append(megatron_worker_memory(policy, shape, shards, reference, refit, count=workers))
        else:
            loss_share = _loss_share(config, algorithm)
            plan.workers.append(
                policy_worker_memory(policy, shape, shards, reference, loss_share, refit, count=workers)
            )
        if has_engines:
            _plan_engines(generation, shape, device_bytes, workers, plan)
    elif hasattr(config, "eval") and _eval_model(config) is not None:
        shape = ModelShape.of(resolve_model_path(config.generation.model_name))
        _plan_engines(config.generation, shape, device_bytes, workers, plan)
    algorithm = registry.algorithm_for(config)
    shards = workers * config.cluster.num_nodes
    for section, model in (algorithm.frozen_models(config) if algorithm else {}).items():
        shape = ModelShape.of(resolve_model_path(model.model_name), model.hf_config_overrides)
        plan.workers.append(inference_worker_memory(f"{section} worker", model.precision, shape, shards, workers))
    for section, model in (algorithm.trained_models(config) if algorithm else {}).items():
        shape = ModelShape.of(resolve_model_path(model.model_name), model.hf_config_overrides)
        share = algorithm.loss_token_share(config) if algorithm else 1.0
        kind = f"{section} worker"
        plan.workers.append(policy_worker_memory(model, shape, shards, False, share, kind=kind, count=workers))
    _fits(config, plan, on_gpu)


def _plan_time(config: Any, plan: Plan) -> None:
    from nemo_rl_clone.algorithms.run.time_plan import has_time_plan, plan_time

    if getattr(config, "policy", None) is not None and has_time_plan(config):
        plan_time(config, plan, plan.prompt_tokens, plan.val_rows)


def _eval_model(config: Any) -> str | None:
    """An evaluation's model when it is a model (not a training checkpoint, exported only when the run starts)."""
    model = config.generation.model_name
    return None if os.path.isfile(os.path.join(os.path.expanduser(model), "training_info.json")) else model


def _loss_share(config: Any, algorithm: Any) -> float:
    """The share of a training microbatch's tokens the loss reads (RL losses: the responses)."""
    return 1.0 if algorithm is None else algorithm.loss_token_share(config)


def _plan_engines(generation: Any, shape: ModelShape, device_bytes: int | None, workers: int, plan: Plan) -> None:
    """The engines' workers on a node (``workers``: the cluster's per node) and what their KV cache holds."""
    from nemo_rl_clone.models.generation.engine_layout import engines_per_node

    vllm_cfg = generation.vllm_cfg
    devices = workers if generation.colocated.enabled else generation.colocated.resources.gpus_per_node or 0
    engines = engines_per_node(vllm_cfg.devices_per_engine, devices)
    engine_columns = engine_workers(vllm_cfg, shape, device_bytes, engines)
    plan.workers.extend(engine_columns)
    tokens = engine_kv_cache_tokens(vllm_cfg, shape, engine_columns[-1].parts["kv_cache"])
    if tokens:
        tp, pp = vllm_cfg.tensor_parallel_size, vllm_cfg.pipeline_parallel_size
        plan.facts.append(
            (
                "engines",
                f"{engines}/node of TP {tp} × PP {pp}; KV cache {tokens:,} tokens each (max_model_len "
                f"{vllm_cfg.max_model_len:,})",
            )
        )


def _fits(config: Any, plan: Plan, on_gpu: bool) -> None:
    if not plan.workers:
        return
    colocated = getattr(getattr(getattr(config, "policy", None), "generation", None), "colocated", None)
    if on_gpu:  # one worker per GPU; a colocated engine sleeps while the policy trains
        need = max(w.total for w in plan.workers)
        what = "the largest worker"
    else:  # every worker is its own process in this machine's RAM, all resident at once
        need = sum(w.total * w.count for w in plan.workers)
        what = "all workers on a node" + (" (policy and engine colocated)" if colocated and colocated.enabled else "")
    plan.facts.append(("planned peak", f"{_gb(need)} for {what}, of {_gb(plan.memory_bytes)} {plan.memory_name}"))
    if need > plan.memory_bytes:
        plan.problems.append(
            f"memory: the plan needs {_gb(need)} for {what} but {plan.memory_name} is {_gb(plan.memory_bytes)}; "
            "lower policy.sequence_packing.train_mb_tokens / train_micro_batch_size, turn on "
            "policy.dtensor_cfg.activation_checkpointing, or shrink the KV cache"
        )
    elif not on_gpu and need > _available_ram_bytes():
        plan.warnings.append(
            f"memory: the plan needs {_gb(need)} but only {_gb(_available_ram_bytes())} of RAM is free now"
        )


def _ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _available_ram_bytes() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return _ram_bytes()


def _gb(nbytes: int) -> str:
    return f"{nbytes / 1e9:.2f} GB"


def print_plan(plan: Plan) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    facts = Table(title="Dry run", show_header=False, expand=False)
    for name, value in plan.facts:
        facts.add_row(name, value)
    console.print(facts)
    if plan.workers:  # one column per worker kind: fits an 80-column terminal
        table = Table(title=f"Planned peak memory per worker, GB ({plan.memory_name}: {_gb(plan.memory_bytes)})")
        table.add_column("")
        for worker in plan.workers:
            table.add_column(f"{worker.kind} ×{worker.count}/node", justify="right")
        for column in COLUMNS:
            table.add_row(column.replace("_", " "), *(f"{w.parts[column] / 1e9:.2f}" for w in plan.workers))
        table.add_row("total", *(f"{w.total / 1e9:.2f}" for w in plan.workers), style="bold")
        console.print(table)
    if plan.times:
        _print_times(console, plan)
    for warning in plan.warnings:
        console.print(f"[yellow]warning: {warning}")
    if not plan.problems:
        console.print("[green]dry run: no problems found; nothing was started, no run directory written")


def _print_times(console: Any, plan: Plan) -> None:
    """One column per layout and length assumption, one row per phase (fits an 80-column terminal)."""
    from rich.table import Table

    from nemo_rl_clone.models.time_estimate import PHASES

    table = Table(title="Planned step time, s")
    table.add_column("")
    for index, (_, assumption, _) in enumerate(plan.times):
        table.add_column(f"{chr(ord('A') + index // 2)}: {assumption}", justify="right")
    for phase in (*PHASES, "step", "validation_share"):
        style = "bold" if phase == "step" else None
        table.add_row(phase.replace("_", " "), *(f"{times[phase]:.1f}" for _, _, times in plan.times), style=style)
    console.print(table)
    for index, layout in enumerate(dict.fromkeys(name for name, _, _ in plan.times)):
        console.print(f"{chr(ord('A') + index)}: {layout}" + (" (this config)" if index == 0 else ""))
    console.print(
        f"bound: every response at max_new_tokens, every sample trained; half: half of each. Rates: {plan.time_source}"
    )
