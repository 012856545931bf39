"""NeMo-RL v0.7.0's evaluation entry points, ``setup`` and ``run_env_eval`` (presented at ``evals.eval``), on this
library's evaluation (`evals.eval`): NeMo-RL's ``run_eval.py`` builds the tokenizer, the dataset and the scoring
environment itself, ``setup(master_config, tokenizer, dataset)`` validates the config once and starts the engines,
and ``run_env_eval`` samples, scores, prints NeMo-RL's result block and shuts the engines and the environment down.
"""

from __future__ import annotations

import json
import os
import weakref
from dataclasses import dataclass
from typing import Any

from nemo_rl_clone.evals.config import EvalMasterConfig
from nemo_rl_clone.evals.eval import _sample_rows, eval_cons_k, eval_pass_k, roll_out_batch, start_engines
from nemo_rl_clone.utils.config_validation import as_config
from nemo_rl_clone.utils.errors import UserInputError

__all__ = ["run_env_eval", "setup"]


@dataclass
class _EngineSession:
    """What `setup` started beside the engines, which `run_env_eval` needs or releases: the tokenizer (prompts are
    token ids here), the cluster and the evaluated model (a converted checkpoint is a temporary folder)."""

    tokenizer: Any
    cluster: Any
    model: Any

    def close(self) -> None:
        self.cluster.shutdown()
        self.model.cleanup()


# generation engines → their session; an entry goes when run_env_eval shuts the engines down
_SESSIONS: weakref.WeakKeyDictionary[Any, _EngineSession] = weakref.WeakKeyDictionary()


def setup(master_config: Any, tokenizer: Any, dataset: Any) -> tuple[Any, Any, EvalMasterConfig]:
    """NeMo-RL's evaluation setup: ``(vllm_generation, dataloader, master_config)``. ``master_config`` (a
    ``MasterConfig(**config)`` with dict sections, a plain dict or a validated config) is validated once and
    returned typed; the dataloader batches ``dataset`` by ``generation.num_prompts_per_step`` (-1: all at once,
    which then reads ``len(dataset)``) in order, with ``eval_collate_fn``."""
    from torch.utils.data import DataLoader

    from nemo_rl_clone.algorithms.utils import set_seed
    from nemo_rl_clone.data.collate_fn import eval_collate_fn
    from nemo_rl_clone.evals.checkpoint import resolve_eval_model

    if tokenizer is None or dataset is None:
        raise UserInputError("tokenizer, dataset: both required by setup(master_config, tokenizer, dataset)")
    config = as_config(master_config, EvalMasterConfig)
    set_seed(config.eval.seed)
    if config.generation.num_prompts_per_step == -1:
        config.generation.num_prompts_per_step = len(dataset)
    dataloader = DataLoader(
        dataset, batch_size=config.generation.num_prompts_per_step, shuffle=False, collate_fn=eval_collate_fn
    )
    print(f"  ✓ Evaluation dataset loaded with {len(dataset)} samples")
    model = resolve_eval_model(config.generation.model_name)
    try:
        cluster, generation = start_engines(config, model.model_path)
    except BaseException:
        model.cleanup()
        raise
    _SESSIONS[generation] = _EngineSession(tokenizer, cluster, model)
    print(f"  ✓ Using {config.generation.backend} backend for generation with {config.generation.model_name}")
    return generation, dataloader, config


def run_env_eval(vllm_generation: Any, dataloader: Any, env: Any, master_config: Any) -> None:
    """Sample ``eval.num_tests_per_prompt`` answers to every prompt of ``dataloader`` with the engines `setup`
    started, score them with ``env`` (a Ray actor handle) and print NeMo-RL's result block: the score summed over
    the problems (pass@k or cons@k) and its mean. Shuts the engines and ``env`` down, as NeMo-RL does; with
    ``eval.save_path`` the samples and the config are written there (NeMo-RL's ``evaluation_data.json`` and
    ``config.json``)."""
    import ray

    session = _SESSIONS.pop(vllm_generation, None)
    if session is None:
        raise UserInputError("vllm_generation: pass the generation setup(master_config, tokenizer, dataset) returned")
    config = as_config(master_config, EvalMasterConfig)
    try:
        score, samples = _score_batches(config, dataloader, env, vllm_generation, session.tokenizer)
    finally:
        ray.kill(env)
        vllm_generation.shutdown()
        session.close()
    if samples and config.eval.save_path is not None:
        save_evaluation_data(samples, config, config.eval.save_path)
    print_results(config, score, len(dataloader.dataset))


def _score_batches(
    config: EvalMasterConfig, dataloader: Any, env: Any, generation: Any, tokenizer: Any
) -> tuple[float, list[dict[str, Any]]]:
    """NeMo-RL's score (the metric summed over problems) and one record per sample."""
    import torch

    n, k = config.eval.num_tests_per_prompt, config.eval.k_value
    score = 0.0
    samples: list[dict[str, Any]] = []
    for prompts in dataloader:
        task_to_env = dict.fromkeys(prompts["task_name"], env)  # one environment scores every row, as in NeMo-RL
        batch = roll_out_batch(config, prompts, tokenizer, generation, task_to_env)
        rows = _sample_rows(batch, n, set())
        rewards = torch.tensor([row["reward"] for row in rows])
        if config.eval.metric == "pass@k":
            score += eval_pass_k(rewards, n, k)
        else:
            score += eval_cons_k(rewards, n, k, [row["extracted_answer"] for row in rows])
        for row, message_log, env_info in zip(rows, batch["message_log"], batch["extra_env_info"], strict=True):
            samples.append(
                {
                    "prompt": row["prompt"],
                    "response": row["response"],
                    "reward": row["reward"],
                    "message_log": [{"role": m["role"], "content": m["content"]} for m in message_log],
                    "extra_env_info": env_info,
                    "sample_index": len(samples),
                }
            )
    return score, samples


def save_evaluation_data(samples: list[dict[str, Any]], config: EvalMasterConfig, save_path: str) -> None:
    """NeMo-RL's saved evaluation: ``<save_path>/config.json`` (model, dataset, metric, sampling) and
    ``<save_path>/evaluation_data.json`` (``{"evaluation_data": [...]}``, message logs and env info as strings)."""
    gen, ev = config.generation, config.eval
    os.makedirs(save_path, exist_ok=True)
    summary = {
        "model_name": gen.model_name,
        "dataset_name": _dataset_name(config),
        "metric": ev.metric,
        "k_value": ev.k_value,
        "num_tests_per_prompt": ev.num_tests_per_prompt,
        "temperature": gen.temperature,
        "top_p": gen.top_p,
        "top_k": gen.top_k,
    }
    config_path = os.path.join(save_path, "config.json")
    with open(config_path, "w", encoding="utf-8") as file:
        json.dump(summary, file, indent=2)
    print(f"\n✓ Configuration saved to: {config_path}")
    as_text = [{**s, "message_log": str(s["message_log"]), "extra_env_info": str(s["extra_env_info"])} for s in samples]
    data_path = os.path.join(save_path, "evaluation_data.json")
    with open(data_path, "w", encoding="utf-8") as file:
        json.dump({"evaluation_data": as_text}, file, indent=2)
    print(f"\n✓ Evaluation data saved to: {data_path}")
    print(f"  Total samples: {len(samples)}")


def print_results(config: EvalMasterConfig, score: float, dataset_size: int) -> None:
    """NeMo-RL's result block: model, dataset, sampling, ``metric=pass@<k>`` and ``score=<mean> (<sum>/<problems>)``."""
    gen, ev = config.generation, config.eval
    model_name = os.path.basename(gen.model_name)
    dataset_name = os.path.basename(_dataset_name(config))
    max_new_tokens = gen.vllm_cfg.max_model_len  # NeMo-RL prints the context length under this name
    temperature, top_p, top_k, seed = gen.temperature, gen.top_p, gen.top_k, ev.seed
    metric, num_tests_per_prompt = ev.metric[:-1] + str(ev.k_value), ev.num_tests_per_prompt
    print("\n" + "=" * 60)
    print(f"{model_name=} {dataset_name=}")
    print(f"{max_new_tokens=} {temperature=} {top_p=} {top_k=} {seed=}\n")
    print(f"metric={metric} {num_tests_per_prompt=}\n")
    print(f"score={score / dataset_size:.4f} ({score}/{dataset_size})")
    print("=" * 60 + "\n")


def _dataset_name(config: EvalMasterConfig) -> str:
    # NeMo-RL's form names a file by its path, which the config here keeps as data_path
    data = config.data
    return data.data_path if data.dataset_name == "local" and data.data_path else data.dataset_name
