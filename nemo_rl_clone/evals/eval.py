"""Evaluation: sample ``num_tests_per_prompt`` answers per problem with vLLM, score each with the task's environment,
and report pass@k or cons@k (docs/evaluation.md; NeMo-RL's ``run_eval.py``).

A sample is *correct* when its reward is 1 (math-verify says equal; reasoning-gym's scorer gives full credit).
Partial credit (reasoning-gym scorers can give e.g. 0.5) counts as not correct, as in GRPO's validation accuracy.

Metrics (pure functions below, averaged over problems):
- pass@k, the unbiased estimator of Chen et al. (2021): with n samples of which c are correct,
  ``pass@k = 1 - C(n-c, k) / C(n, k)``, the probability that k samples drawn without replacement from the n contain
  a correct one. Exactly 0 when c = 0 and exactly 1 when n - c < k.
- cons@k (majority vote): the answers extracted from the first k samples vote; samples without an extracted answer
  abstain. The most frequent answer wins; a tie goes to the tied answer that appears first (lowest sample index).
  The problem counts as solved when the winning answer is correct (the reward of the first sample that gave it). No
  votes at all: not solved. Answers are compared as strings after stripping surrounding whitespace, so ``1/2`` and
  ``0.5`` are different votes.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from fractions import Fraction
from itertools import combinations
from math import comb
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_rl_clone.evals.config import EvalConfig as EvalConfig  # NeMo-RL's name at its path
from nemo_rl_clone.evals.config import EvalMasterConfig
from nemo_rl_clone.utils.lazy_exports import lazy_getattr

if TYPE_CHECKING:
    import torch

# NeMo-RL's name of the evaluation config: built as ``MasterConfig(**config)``, validated by `setup`.
MasterConfig = EvalMasterConfig
# NeMo-RL's ``setup`` / ``run_env_eval`` (its run_eval.py's form), on this module's machinery; loaded on first use.
__getattr__ = lazy_getattr("nemo_rl_clone.evals", {"setup": "nemo_rl_api", "run_env_eval": "nemo_rl_api"})

CORRECT_REWARD = 1.0


# ---------------------------------------------------------------------------- metrics (pure)
def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k of one problem: ``1 - C(n-c, k) / C(n, k)`` with n = ``num_samples``, c = ``num_correct``.

    Computed in exact rational arithmetic and rounded once, so e.g. n=5, c=2, k=2 gives exactly ``float(7/10)``.
    Raises ValueError unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    n, c = num_samples, num_correct
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(
            f"pass@k needs 0 <= num_correct <= num_samples and 1 <= k <= num_samples; got n={n}, c={c}, k={k}"
        )
    if n - c < k:  # every draw of k samples contains a correct one
        return 1.0
    return float(1 - Fraction(comb(n - c, k), comb(n, k)))


def majority_vote(answers: Sequence[str | None]) -> int | None:
    """Index of the sample whose answer wins the vote among ``answers`` (None entries abstain), or None if nobody
    voted. Ties go to the answer that appears first; the index returned is that answer's first occurrence."""
    votes = [(index, answer.strip()) for index, answer in enumerate(answers) if answer is not None and answer.strip()]
    if not votes:
        return None
    counts = Counter(answer for _, answer in votes)
    best = max(counts.values())
    # votes are in sample order: the first answer reaching the top count is the earliest of the tied ones
    return next(index for index, answer in votes if counts[answer] == best)


def cons_at_k(answers: Sequence[str | None], correct: Sequence[bool], k: int) -> float:
    """cons@k of one problem: 1.0 if the majority answer of the first ``k`` samples is correct, else 0.0."""
    if len(answers) != len(correct):
        raise ValueError(f"cons@k: {len(answers)} answers but {len(correct)} correctness flags")
    if not 1 <= k <= len(answers):
        raise ValueError(f"cons@k needs 1 <= k <= number of samples ({len(answers)}), got k={k}")
    winner = majority_vote(answers[:k])
    return 1.0 if winner is not None and correct[winner] else 0.0


def score_problems(
    metric: str, correct: Sequence[bool], answers: Sequence[str | None], num_tests_per_prompt: int, k: int
) -> list[float]:
    """Per-problem scores; samples are grouped by problem, ``num_tests_per_prompt`` consecutive samples each."""
    n = num_tests_per_prompt
    if len(correct) % n or len(answers) != len(correct):
        raise ValueError(f"{len(correct)} samples ({len(answers)} answers) do not form groups of {n} per problem")
    groups = range(0, len(correct), n)
    if metric == "pass@k":
        return [pass_at_k(n, sum(bool(x) for x in correct[g : g + n]), k) for g in groups]
    if metric == "cons@k":
        return [cons_at_k(answers[g : g + n], correct[g : g + n], k) for g in groups]
    raise ValueError(f"unknown metric {metric!r}; valid: pass@k, cons@k")


def eval_pass_k(rewards: torch.Tensor, num_tests_per_prompt: int, k: int) -> float:
    """NeMo-RL's pass@k over a batch: the *sum* over problems of `pass_at_k` (divide by the number of problems for
    the mean). ``rewards`` is [problems * num_tests_per_prompt], grouped by problem; a sample is correct when its
    reward is 1."""
    correct = [float(r) >= CORRECT_REWARD for r in _flat_rewards(rewards)]
    return float(sum(score_problems("pass@k", correct, [None] * len(correct), num_tests_per_prompt, k)))


def eval_cons_k(
    rewards: torch.Tensor, num_tests_per_prompt: int, k: int, extracted_answers: Sequence[str | None]
) -> float:
    """NeMo-RL's cons@k over a batch: per problem, the fraction of all size-``k`` subsets of its samples whose
    majority answer (`majority_vote`) is correct; returns the *sum* over problems. ``rewards`` and
    ``extracted_answers`` are grouped by problem, ``num_tests_per_prompt`` each. Cost grows as C(n, k) per problem."""
    flat = _flat_rewards(rewards)
    n = num_tests_per_prompt
    if len(extracted_answers) != len(flat) or len(flat) % n:
        raise ValueError(f"{len(flat)} rewards and {len(extracted_answers)} answers do not form groups of {n}")
    if not 1 <= k <= n:
        raise ValueError(f"cons@k needs 1 <= k <= num_tests_per_prompt ({n}), got k={k}")
    total = 0.0
    for start in range(0, len(flat), n):
        correct = [r >= CORRECT_REWARD for r in flat[start : start + n]]
        answers = extracted_answers[start : start + n]
        subsets = list(combinations(range(n), k))
        solved = sum(cons_at_k([answers[i] for i in s], [correct[i] for i in s], k) for s in subsets)
        total += solved / len(subsets)
    return total


def _flat_rewards(rewards: torch.Tensor | Sequence[float]) -> list[float]:
    # a tensor (any device) or a plain sequence; torch stays a lazy import of this module
    values = rewards.detach().cpu().reshape(-1).tolist() if hasattr(rewards, "detach") else list(rewards)
    return [float(v) for v in values]


def sample_seeds(seed: int, prompt_indices: Sequence[int], num_tests_per_prompt: int) -> list[int]:
    """One sampling seed per (problem, sample), problem-major: results do not depend on how problems are batched
    or spread over engines."""
    n = num_tests_per_prompt
    return [(seed * 1_000_003 + p) * n + j for p in prompt_indices for j in range(n)]


# ---------------------------------------------------------------------------- the run
def run_evaluation(config: EvalMasterConfig) -> dict[str, Any]:
    """Evaluate ``config.generation.model_name`` on ``config.data``; returns the summary (also printed, and logged
    when a ``logger`` section exists). Per-sample rows go to ``config.eval.save_path`` when it is set."""
    from nemo_rl_clone.algorithms.run.state import set_seeds
    from nemo_rl_clone.distributed.virtual_cluster import init_ray
    from nemo_rl_clone.evals.checkpoint import resolve_eval_model

    set_seeds(config.eval.seed)
    model = resolve_eval_model(config.generation.model_name)
    try:
        tokenizer = load_eval_tokenizer(config, model.tokenizer_path)
        dataset = load_eval_problems(config, tokenizer)
        log_dir, run_logger = _start_logger(config)
        with run_logger if run_logger is not None else contextlib.nullcontext():
            init_ray(log_dir=str(log_dir) if log_dir else None)
            rows = _generate_with_engines(config, model.model_path, dataset, tokenizer)
            summary = summarize(config, rows, model.description)
            if config.eval.save_path:
                write_jsonl(rows, Path(config.eval.save_path))
            print_summary(summary, config)
            if run_logger is not None:
                run_logger.log_metrics(_logged_metrics(summary), step=model.step or 0, prefix="eval")
        return summary
    finally:
        model.cleanup()


def _generate_with_engines(
    config: EvalMasterConfig, model_path: str, dataset: Any, tokenizer: Any
) -> list[dict[str, Any]]:
    """Start the scoring environment and the generation engines, roll out, and always shut them down."""
    import ray

    from nemo_rl_clone.environments import create_env

    task = config.data.task_name
    env = create_env(task, config.env[task])
    cluster, generation = None, None
    try:
        cluster, generation = start_engines(config, model_path)
        return generate_and_score(config, dataset, tokenizer, generation, {task: env})
    finally:
        if generation is not None:
            generation.shutdown()
        ray.kill(env)
        if cluster is not None:
            cluster.shutdown()


def start_engines(config: EvalMasterConfig, model_path: str) -> tuple[Any, Any]:
    """The evaluation cluster and the generation backend's engines on it (one per bundle), serving ``model_path``."""
    import torch

    from nemo_rl_clone.algorithms.run.setup import ray_cluster
    from nemo_rl_clone.models.generation.factory import build_generation

    use_gpus = torch.cuda.is_available()
    section = config.cluster
    cluster = ray_cluster(section, "eval", use_gpus, section.gpus_per_node, section.num_nodes, role="evaluation")
    # Ray gives each CPU actor 1 thread; the engines are all that runs here, so they share every core.
    cores = max(1, (os.cpu_count() or 1) // config.cluster.gpus_per_node)
    try:
        generation = build_generation(
            cluster,
            config.generation,
            model_path,
            name_prefix="vllm_eval",
            seed=config.eval.seed,
            env_vars={} if use_gpus else {"OMP_NUM_THREADS": str(cores)},
        )
    except BaseException:
        cluster.shutdown()
        raise
    return cluster, generation


def load_eval_tokenizer(config: EvalMasterConfig, default_path: str) -> Any:
    """``tokenizer.name`` (null or equal to ``generation.model_name``: the model's own tokenizer, which for a checkpoint
    is its ``policy/tokenizer``) with ``tokenizer.chat_template`` / ``chat_template_kwargs`` applied (see
    `TokenizerConfig`)."""
    name = config.tokenizer.name
    return replace(config.tokenizer, name=None if name == config.generation.model_name else name).load(default_path)


def load_eval_problems(config: EvalMasterConfig, tokenizer: Any) -> Any:
    """The evaluation problems as prompts (an `AllTaskProcessedDataset` over the dataset's evaluation rows)."""
    from nemo_rl_clone.data.datasets.common import AllTaskProcessedDataset
    from nemo_rl_clone.data.datasets.eval_datasets import load_eval_dataset

    data = config.data
    section = {
        "dataset_name": data.dataset_name,
        "data_path": data.data_path,
        "problem_key": data.problem_key,
        "solution_key": data.solution_key,
        "file_format": data.file_format,
        "split": data.split,
        "prompt_file": data.prompt_file,
        "system_prompt_file": data.system_prompt_file,
        "reasoning_gym": data.reasoning_gym,
    }
    loaded = load_eval_dataset(section, seed=config.eval.seed)
    # The set's own processor: multiple-choice rows are scored by env.math but are not math rows.
    return AllTaskProcessedDataset(
        loaded.rekeyed_ds, tokenizer, loaded.task_spec, loaded.processor, max_seq_length=data.max_input_seq_length
    )


def generate_and_score(
    config: EvalMasterConfig, dataset: Any, tokenizer: Any, generation: Any, task_to_env: dict[str, Any]
) -> list[dict[str, Any]]:
    """Roll out every problem ``num_tests_per_prompt`` times (one turn each); one row per sample, problem-major."""
    from rich.console import Console

    from nemo_rl_clone.data.collate_fn import eval_collate_fn

    console = Console()
    n = config.eval.num_tests_per_prompt
    per_step = config.generation.num_prompts_per_step
    per_step = len(dataset) if per_step == -1 else per_step
    rows: list[dict[str, Any]] = []
    for start in range(0, len(dataset), per_step):
        indices = list(range(start, min(len(dataset), start + per_step)))
        data = [dataset[i] for i in indices]
        cut = [i for i, datum in zip(indices, data, strict=True) if datum["loss_multiplier"] == 0.0]
        if cut:  # the processor shortened these prompts to data.max_input_seq_length: the model saw a cut problem
            console.log(f"[yellow]problems {cut} are longer than data.max_input_seq_length and were truncated")
        batch = roll_out_batch(config, eval_collate_fn(data), tokenizer, generation, task_to_env)
        rows.extend(_sample_rows(batch, n, set(cut)))
        console.log(f"generated {len(rows)}/{len(dataset) * n} samples")
    return rows


def roll_out_batch(
    config: EvalMasterConfig, prompts: Any, tokenizer: Any, generation: Any, task_to_env: Mapping[str, Any]
) -> Any:
    """One turn of ``num_tests_per_prompt`` samples of every prompt of a collated batch (``eval_collate_fn``), scored
    by the environments; the rolled-out batch, problem-major."""
    from nemo_rl_clone.rollout.multi_turn import run_multi_turn_rollout

    n = config.eval.num_tests_per_prompt
    indices = [int(i) for i in prompts["idx"]]
    prompts = prompts.repeat_interleave(n)
    prompts["seeds"] = sample_seeds(config.eval.seed, indices, n)
    generation.prepare_for_generation()
    batch, _ = run_multi_turn_rollout(
        generation,
        prompts,
        tokenizer,
        task_to_env,
        max_seq_len=config.generation.vllm_cfg.max_model_len,
        max_rollout_turns=1,
        greedy=config.generation.temperature == 0,
    )
    generation.finish_generation()
    return batch


def _sample_rows(batch: Any, num_tests_per_prompt: int, cut_prompts: set[int]) -> list[dict[str, Any]]:
    rows = []
    for i, log in enumerate(batch["message_log"]):
        reward = float(batch["total_reward"][i])
        prompt_index = int(batch["idx"][i])
        rows.append(
            {
                "prompt_index": prompt_index,
                "sample_index": i % num_tests_per_prompt,
                "prompt": "".join(m["content"] for m in log if m["role"] != "assistant"),
                "response": "".join(m["content"] for m in log if m["role"] == "assistant"),
                "reward": reward,
                "correct": reward >= CORRECT_REWARD,
                "extracted_answer": batch["extracted_answers"][i],
                "ground_truth": _ground_truth(batch["extra_env_info"][i]),
                "truncated": bool(batch["truncated"][i]),
                "prompt_truncated": prompt_index in cut_prompts,
                "response_tokens": sum(len(m["token_ids"]) for m in log if m["role"] == "assistant"),
            }
        )
    return rows


def _ground_truth(env_info: dict[str, Any]) -> str | None:
    if "ground_truth" in env_info:  # math
        return str(env_info["ground_truth"])
    entry = env_info.get("entry")  # reasoning-gym
    return str(entry["answer"]) if isinstance(entry, dict) and "answer" in entry else None


def summarize(config: EvalMasterConfig, rows: Sequence[dict[str, Any]], model_description: str) -> dict[str, Any]:
    """The run's summary: ``score`` (the metric averaged over problems) and descriptive statistics."""
    n, k, metric = config.eval.num_tests_per_prompt, config.eval.k_value, config.eval.metric
    correct = [row["correct"] for row in rows]
    per_problem = score_problems(metric, correct, [row["extracted_answer"] for row in rows], n, k)
    return {
        "metric": metric.replace("@k", f"@{k}"),
        "score": sum(per_problem) / len(per_problem),
        "num_problems": len(per_problem),
        "num_tests_per_prompt": n,
        "num_samples": len(rows),
        "accuracy": sum(correct) / len(rows),
        "mean_reward": sum(row["reward"] for row in rows) / len(rows),
        "avg_length": sum(row["response_tokens"] for row in rows) / len(rows),
        "truncation_rate": sum(row["truncated"] for row in rows) / len(rows),
        "num_truncated_prompts": len({row["prompt_index"] for row in rows if row.get("prompt_truncated")}),
        "answer_extracted_rate": sum(row["extracted_answer"] is not None for row in rows) / len(rows),
        "model": model_description,
        "dataset": config.data.dataset_name,
    }


def _logged_metrics(summary: dict[str, Any]) -> dict[str, float]:
    numbers = {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {summary["metric"]: summary["score"], **numbers}


def write_jsonl(rows: Sequence[dict[str, Any]], path: Path) -> None:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def print_summary(summary: dict[str, Any], config: EvalMasterConfig) -> None:
    from rich.console import Console
    from rich.table import Table

    gen = config.generation
    table = Table(title=f"Evaluation: {summary['metric']} = {summary['score']:.4f}", show_header=False)
    for name, value in (
        ("model", summary["model"]),
        (
            "dataset",
            f"{summary['dataset']} ({summary['num_problems']} problems x {summary['num_tests_per_prompt']} samples)",
        ),
        (
            "sampling",
            f"temperature={gen.temperature} top_p={gen.top_p} top_k={gen.top_k} "
            f"max_new_tokens={gen.max_new_tokens} seed={config.eval.seed}",
        ),
        (summary["metric"], f"{summary['score']:.4f}"),
        ("sample accuracy", f"{summary['accuracy']:.4f} (mean reward {summary['mean_reward']:.4f})"),
        ("answer extracted", f"{summary['answer_extracted_rate']:.4f}"),
        ("avg response tokens", f"{summary['avg_length']:.1f} (truncated {summary['truncation_rate']:.2%})"),
        ("samples", config.eval.save_path or "not saved (eval.save_path is null)"),
    ):
        table.add_row(name, str(value))
    if summary["num_truncated_prompts"]:
        table.add_row("[yellow]truncated prompts", f"{summary['num_truncated_prompts']} (data.max_input_seq_length)")
    Console().print(table)


def _start_logger(config: EvalMasterConfig) -> tuple[Path | None, Any]:
    if config.logger is None:
        return None, None
    from nemo_rl_clone.utils.config import save_config
    from nemo_rl_clone.utils.config_validation import config_to_dict
    from nemo_rl_clone.utils.logger import Logger, get_next_experiment_dir

    log_dir = get_next_experiment_dir(config.logger.log_dir)
    resolved = config_to_dict(config)
    save_config(resolved, log_dir / "config.yaml")
    run_logger = Logger(config.logger, log_dir, quiet=True)
    run_logger.log_hyperparams(resolved)
    return log_dir, run_logger
