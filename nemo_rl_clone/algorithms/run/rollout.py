"""A rollout-based run (GRPO, async GRPO, PPO, distillation): building it (`setup_rollout_run`: data, environments,
clusters, policy, engines on the shared start `run.setup.setup_run`), checkpointing and validating it, and the
`Algorithm` hooks every rollout-based algorithm answers alike (`RolloutAlgorithm`)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import torch
from torch.utils.data import IterableDataset

from nemo_rl_clone.algorithms.interfaces import Algorithm
from nemo_rl_clone.algorithms.loss.registry import build_loss
from nemo_rl_clone.algorithms.run.setup import RunStart, give_megatron_its_steps, ray_cluster, setup_run
from nemo_rl_clone.algorithms.run.state import run_validation, save_run_checkpoint
from nemo_rl_clone.contract.sampling import TrainingSamplingParams
from nemo_rl_clone.data.collate_fn import rl_collate_fn
from nemo_rl_clone.data.config import DataConfig
from nemo_rl_clone.data.dataloader import DrawnRows, StatefulPromptLoader
from nemo_rl_clone.data.datasets import DataError, load_dataset_by_name, load_dataset_from_config, seed_argument
from nemo_rl_clone.data.datasets.common import AllTaskProcessedDataset
from nemo_rl_clone.data.interfaces import TaskDataSpec
from nemo_rl_clone.distributed.segment_topology import SegmentPlacement
from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl_clone.environments import create_env
from nemo_rl_clone.models.generation.factory import build_generation
from nemo_rl_clone.models.generation.interfaces import GenerationInterface
from nemo_rl_clone.models.policy.lm_policy import Policy
from nemo_rl_clone.rollout.config import RolloutRunConfig
from nemo_rl_clone.rollout.refit import init_refit_collective, prepare_refit
from nemo_rl_clone.rollout.rewards import accuracy_reward
from nemo_rl_clone.rollout.run import RolloutRun
from nemo_rl_clone.rollout.step_rollouts import roll_out
from nemo_rl_clone.utils.progress import phase
from nemo_rl_clone.utils.samples import print_samples, sample_rows


@dataclass
class GivenParts:
    """What a caller built before the run's setup (NeMo-RL's ``setup(master_config, tokenizer, dataset,
    val_dataset)``): the tokenizer and the prompt datasets. The run then logs into ``logger.log_dir`` as given and
    starts no environments: the caller made them and passes them to the train function."""

    tokenizer: Any
    train: Any
    validation: Any
    # NeMo-RL's ``setup(..., policy_factory=)``: builds the policy from `Policy`'s keyword arguments (run_grpo.py
    # passes one that makes a `TQPolicy` when data_plane.enabled)
    policy_factory: Callable[..., Policy] | None = None


def setup_rollout_run(
    config: RolloutRunConfig,
    loss_fn: Any,
    extra_worker_groups: int = 0,
    weight_updates_during_generation: bool = False,
    given: GivenParts | None = None,
) -> RolloutRun[Any]:
    """Build a rollout-based run from its validated ``config``; resumes from ``checkpointing.checkpoint_dir`` if it
    holds one. ``loss_fn`` is the policy's loss (None when the algorithm trains with its own); ``extra_worker_groups``
    counts further worker groups that will share the training cluster's bundles (a teacher, a critic); ``given``:
    the parts the caller built itself (otherwise built here from the config)."""
    build_data: Callable[[], tuple[StatefulPromptLoader, Any]]
    after_ray: Callable[[], Any] | None
    if given is None:
        tokenizer = config.policy.tokenizer.load(config.policy.model_name)
        build_data, after_ray = (lambda: setup_data(config, tokenizer)), (lambda: create_envs(config.env))
    else:
        tokenizer, train, validation = given.tokenizer, given.train, given.validation
        build_data, after_ray = (lambda: (prompt_loader(config, train), validation)), None
    start = setup_run(
        config, config.loop.seed, tokenizer, build_data, after_ray=after_ray, log_dir_as_given=given is not None
    )
    policy_factory = (
        given.policy_factory if given is not None and given.policy_factory else default_policy_factory(config)
    )
    policy, generation, clusters, colocated = _setup_workers(
        config, tokenizer, start, extra_worker_groups, weight_updates_during_generation, policy_factory
    )
    return RolloutRun(
        config=config,
        tokenizer=tokenizer,
        policy=policy,
        generation=generation,
        dataloader=start.dataloader,
        val_dataset=start.data,
        task_to_env=start.services or {},
        loss_fn=loss_fn,
        logger=start.logger,
        checkpointer=start.checkpointer,
        state=start.state,
        colocated=colocated,
        log_dir=start.log_dir,
        clusters=clusters,
    )


def clipped_pg_loss(section: Any, generation: Any) -> Any:
    """The policy's clipped policy-gradient loss (``loss_fn``; ``loss_fn.name`` may name another), sampling as the
    engines do (GRPO's and PPO's actor)."""
    sampling = TrainingSamplingParams.from_generation(generation)
    return build_loss(section.name, "clipped_pg", section.loss_config(), sampling)


def create_envs(env: Any) -> dict[str, Any]:
    """One environment actor per ``env`` section, by its name (a data row's ``task_name`` routes to it)."""
    return {name: create_env(name, env_cfg) for name, env_cfg in env.items()}


def setup_data(config: RolloutRunConfig, tokenizer: Any) -> tuple[StatefulPromptLoader, AllTaskProcessedDataset | None]:
    seed = config.data.split_seed(config.loop.seed)
    train, val = prompt_datasets(config.data, config.env, tokenizer, seed)
    return prompt_loader(config, train), val


def prompt_datasets(
    data: DataConfig, env: Any, tokenizer: Any, seed: int
) -> tuple[AllTaskProcessedDataset, AllTaskProcessedDataset | None]:
    """The training and validation prompts the ``data`` section describes (``env``: the environment sections, which
    give generated games their rules), tokenized; ``seed`` seeds validation hold-outs."""
    loaded = load_dataset_from_config(data, seed=seed, env=env)
    if loaded.train is None:
        raise DataError(f"data.dataset_name: {loaded.name!r} has no training split (it is an evaluation set)")
    validation_rows = _validation_rows(data, loaded.validation, seed)
    spec = TaskDataSpec(
        task_name=data.task_name, prompt_file=data.prompt_file, system_prompt_file=data.system_prompt_file
    )
    max_len = data.max_input_seq_length
    train = AllTaskProcessedDataset(loaded.train, tokenizer, spec, max_seq_length=max_len, env_name=data.env_name)
    val = (
        AllTaskProcessedDataset(validation_rows, tokenizer, spec, max_seq_length=max_len, env_name=data.env_name)
        if validation_rows
        else None
    )
    return train, val


def prompt_loader(config: RolloutRunConfig, dataset: Any) -> StatefulPromptLoader:
    """The resumable loader of a step's prompts from ``dataset``; a torch ``IterableDataset`` with a length (a
    NeMo-RL script's generated prompts) is read in order as it is drawn (`DrawnRows`)."""
    drawn = isinstance(dataset, IterableDataset)
    return StatefulPromptLoader(
        DrawnRows(dataset) if drawn else dataset,
        config.loop.prompts_per_generation_batch,
        rl_collate_fn,
        shuffle=config.data.shuffle and not drawn,
        seed=config.loop.seed,
    )


def _validation_rows(data: DataConfig, own: Any, seed: int) -> Any:
    """The validation rows: the training dataset's own, or those of ``data.validation.dataset_name``; each row
    ``data.validation.repeat`` times."""
    section = data.validation
    if section is None:
        return own
    rows = own
    if section.dataset_name not in (None, data.dataset_name):
        options: dict[str, Any] = dict(seed_argument(section.dataset_name, seed))
        if section.data_path is not None:
            options["data_path"] = section.data_path
        other = load_dataset_by_name(section.dataset_name, **options)
        rows = other.validation if other.validation is not None else other.train
    if rows is None or section.repeat == 1:
        return rows
    if isinstance(rows, datasets.Dataset):
        return datasets.concatenate_datasets([rows] * section.repeat)
    return list(rows) * section.repeat


def save_checkpoint(components: RolloutRun[Any], loader_position: Any = None) -> Path | None:
    """Write ``step_N`` through ``tmp_step_N`` (atomic rename); the manager prunes to the top-k afterwards.

    ``loader_position`` is what the prompt loader's saved position is read from (default: the loader itself; async
    GRPO passes the position of the last trained rollouts, its collector's loader runs ahead)."""
    c = components
    position = c.dataloader if loader_position is None else loader_position
    return save_run_checkpoint(c.checkpointer, c.policy, position, c.state, c.config)


def default_policy_factory(config: RolloutRunConfig) -> Callable[..., Policy]:
    """`Policy`, or with ``data_plane.enabled`` (GRPO) a `TQPolicy` over the queue that section configures."""
    data_plane = getattr(config, "data_plane", None)
    if data_plane is None or not data_plane.enabled:
        return Policy
    from nemo_rl_clone.models.policy.tq_policy import TQPolicy

    return functools.partial(TQPolicy, dp_cfg=data_plane)


def _setup_workers(
    config: RolloutRunConfig,
    tokenizer: Any,
    start: RunStart[Any],
    extra_worker_groups: int,
    weight_updates_during_generation: bool,
    policy_factory: Callable[..., Policy],
) -> tuple[Policy, GenerationInterface, list[RayVirtualCluster], bool]:
    """The policy workers and the engines (they start while the policy workers load and shard the model), with the
    refit path between them."""
    use_gpus = torch.cuda.is_available()
    gen_cfg = config.policy.generation
    assert gen_cfg is not None  # rollout_problems requires it
    colocated = gen_cfg.colocated.enabled
    clusters = _clusters(config, use_gpus, extra_worker_groups)
    train_cluster, gen_cluster = clusters[0], clusters[-1]
    # On CPU, colocated groups take turns on the same cores: each may use all of them while it runs.
    shared = colocated or extra_worker_groups > 0
    threads = {} if use_gpus or not shared else {"OMP_NUM_THREADS": str(os.cpu_count() or 1)}
    give_megatron_its_steps(
        config.policy, config.loop, start.dataloader.batches_per_epoch, getattr(config.loop, "ppo_epochs", 1)
    )
    policy = policy_factory(
        cluster=train_cluster,
        config=config.policy,
        tokenizer=tokenizer,
        weights_path=start.weights_path,
        optimizer_path=start.optimizer_path,
        init_reference_model=config.needs_reference_model,
        env_vars=threads,
        wait=False,  # the engines start while the policy workers load and shard the model
    )
    generation = build_generation(
        gen_cluster,
        gen_cfg,
        config.policy.model_name,
        seed=config.loop.seed,
        env_vars=threads,
        weight_updates_during_generation=weight_updates_during_generation,
        hf_config_overrides=config.policy.hf_config_overrides,
        record_routing=config.policy.router_replay.enabled,
        policy=policy,  # backend megatron: the policy's workers sample
    )
    policy.wait_until_ready()
    prepare_refit(policy, generation)
    if not colocated:
        init_refit_collective(policy, generation, train_cluster)
    return policy, generation, clusters, colocated


def _clusters(config: RolloutRunConfig, use_gpus: bool, extra_worker_groups: int) -> list[RayVirtualCluster]:
    """Colocated: one cluster, two worker groups time-sharing its bundles. Otherwise a cluster each (training
    first, then generation)."""
    gen_cfg = config.policy.generation
    assert gen_cfg is not None  # rollout_problems requires it
    colocated = gen_cfg.colocated.enabled
    # with cluster.segment_size, generation's segments come from the nodes training left
    placement = SegmentPlacement(config.cluster.segment_size)
    train_cluster = ray_cluster(
        config.cluster,
        "grpo_train",
        use_gpus,
        config.cluster.gpus_per_node,
        config.cluster.num_nodes,
        max_colocated_worker_groups=(2 if colocated else 1) + extra_worker_groups,
        placement=placement,
        collective_timeout_s=config.watchdog.collective_timeout_s,
    )
    if colocated:
        return [train_cluster]
    resources = gen_cfg.colocated.resources
    assert resources.gpus_per_node is not None and resources.num_nodes is not None  # ColocatedConfig.check
    try:
        gen_cluster = ray_cluster(
            config.cluster,
            "grpo_generation",
            use_gpus,
            resources.gpus_per_node,
            resources.num_nodes,
            placement=placement,
            role="generation",
            nodes_key="policy.generation.colocated.resources.num_nodes",
        )
    except BaseException:
        train_cluster.shutdown()
        raise
    return [train_cluster, gen_cluster]


def validate(c: RolloutRun[Any], samples: list[dict[str, Any]] | None = None) -> dict[str, float]:
    """Roll out the validation prompts, ``num_val_generations_per_prompt`` samples each (sampled with fixed seeds per
    prompt and sample, so runs compare fairly; a prompt's first sample is the one a run with one sample draws).

    Returns ``accuracy`` (fraction of responses whose `accuracy_reward` is 1), ``mean_reward`` (what a graded scorer
    such as a reward model is judged by) and ``avg_length`` (generated tokens), each over every sample (mean@k, as
    NeMo-RL averages its repeated prompts); with several samples per prompt also ``pass@<k>`` (the share of prompts
    with at least one correct sample). ``samples`` receives the first ``logger.num_val_samples_to_print`` samples as
    `sample_rows` rows.
    """
    cfg, loop = c.config, c.config.loop
    if c.val_dataset is None:
        return {}
    count = min(len(c.val_dataset), loop.max_val_samples or len(c.val_dataset))
    batch_size = loop.val_batch_size or count
    k = loop.num_val_generations_per_prompt
    rewards, correct, lengths = [], [], []
    for start in range(0, count, batch_size):
        prompts = rl_collate_fn([c.val_dataset[i] for i in range(start, min(count, start + batch_size))])
        seeds = [loop.seed * 100_003 + start + i for i in range(prompts.size)]
        if k > 1:  # sample j of each prompt draws with the prompt's seed moved by j strides (rows prompt-major)
            prompts = prompts.repeat_interleave(k)
            seeds = [seed + j * _VAL_SAMPLE_SEED_STRIDE for seed in seeds for j in range(k)]
        prompts["seeds"] = seeds
        batch, metrics = roll_out(c, prompts)
        if samples is not None and len(samples) < cfg.logger.num_val_samples_to_print:
            rows = sample_rows(batch, batch["total_reward"])
            samples.extend(rows[: cfg.logger.num_val_samples_to_print - len(samples)])
        rewards.append(batch["total_reward"])
        correct.append(accuracy_reward(batch) == 1.0)
        lengths.append(metrics["mean_generation_length"] * batch.size)
    c.generation.take_performance_metrics()  # validation's generation is not the next training step's
    return validation_metrics(torch.cat(correct), torch.cat(rewards), sum(lengths), k)


def validation_metrics(correct: torch.Tensor, rewards: torch.Tensor, total_length: float, k: int) -> dict[str, float]:
    """`validate`'s metrics from every sample's verdict and reward (rows prompt-major, ``k`` per prompt) and the
    generated tokens of all of them."""
    result = {
        "accuracy": correct.float().mean().item(),
        "mean_reward": rewards.float().mean().item(),
        "avg_length": total_length / correct.numel(),
    }
    if k > 1:
        result[f"pass@{k}"] = correct.view(-1, k).any(dim=1).float().mean().item()
    return result


# Far apart from the per-prompt seeds (consecutive integers): a prompt's later samples reuse no other prompt's seed.
_VAL_SAMPLE_SEED_STRIDE = 1_000_003


def log_validation(c: RolloutRun[Any], step: int) -> None:
    phase(step, "validation")
    samples: list[dict[str, Any]] = []
    run_validation(lambda: validate(c, samples), c.state, c.logger, step, shown=("accuracy", "avg_length"))
    print_samples(samples, f"step {step}: validation sample")


def step_performance(metrics: dict[str, float], timing: dict[str, float]) -> dict[str, float]:
    """``performance/*`` throughput of a step that generated, then trained its policy."""
    total_tokens = metrics["total_num_tokens"]
    return {
        "tokens_per_sec": total_tokens / max(timing["total_step_time"], 1e-9),
        "generation_tokens_per_sec": metrics["generated_tokens"] / max(timing["generation"], 1e-9),
        "policy_training_tokens_per_sec": total_tokens / max(timing["policy_training"], 1e-9),
    }


def response_token_share(config: RolloutRunConfig) -> float:
    """At most this share of a sequence is response tokens, the ones an RL loss reads."""
    generation = config.policy.generation
    assert generation is not None  # rollout_problems requires it
    return min(1.0, generation.max_new_tokens / config.policy.max_total_sequence_length)


class RolloutAlgorithm(Algorithm):
    """The `Algorithm` hooks every rollout-based algorithm answers from its config alike: the prompt data, the
    reference model, the loss's token share (the responses) and multi-turn rollouts."""

    def datasets(self, config: Any, tokenizer: Any) -> tuple[Any, Any, int | None]:
        loader, validation = setup_data(config, tokenizer)
        return loader.dataset, validation, config.data.max_input_seq_length

    def needs_reference_model(self, config: Any) -> bool:
        return bool(config.needs_reference_model)

    def loss_token_share(self, config: Any) -> float:
        return response_token_share(config)

    def multi_turn(self, config: Any) -> bool:
        return bool(config.loop.max_rollout_turns > 1)
