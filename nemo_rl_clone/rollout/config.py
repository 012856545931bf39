"""The loop section every rollout-based algorithm shares (``grpo``, ``ppo``, ``distillation``: NeMo-RL's keys, each
algorithm's own defaults), the reward keys of the loops that train on rewards, and what the rollout machinery reads
of a whole run's config (`RolloutRunConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from nemo_rl_clone.utils.config_validation import SectionReads, check_at_least


@dataclass
class RolloutLoopConfig(SectionReads):
    """The step loop's keys every rollout-based algorithm has (its section composes this class)."""

    num_prompts_per_step: int = 32  # prompts each step draws
    num_generations_per_prompt: int = 16  # responses sampled per prompt (a group)
    max_rollout_turns: int = 1  # an episode ends after this many generate + environment turns
    max_num_epochs: int = 1  # passes over the training prompts; the run stops at this or max_num_steps
    max_num_steps: int = 1000000  # training steps; the run stops at this or max_num_epochs
    val_period: int = 10  # validate every this many steps; 0: never (val_at_start too)
    val_at_start: bool = False  # validate before the first step (with val_period > 0)
    val_at_end: bool = False  # validate after the last step
    # null (NeMo-RL's NeMo-Gym recipes): every validation row, in one batch.
    max_val_samples: int | None = 256
    val_batch_size: int | None = 256  # validation prompts per generation batch; null: all in one
    # NeMo-RL's GRPO key: samples per validation prompt. accuracy / mean_reward / avg_length average all of them
    # (mean@k); pass@k is the share of prompts with a correct one.
    num_val_generations_per_prompt: int = 1
    seed: int = 42  # seeds torch/numpy/random, the prompt shuffling and every sample's generation seed

    def check(self) -> list[tuple[str, str]]:
        return check_at_least(
            self,
            1,
            "num_prompts_per_step",
            "num_generations_per_prompt",
            "max_rollout_turns",
            "max_num_epochs",
            "max_num_steps",
            "max_val_samples",
            "val_batch_size",
            "num_val_generations_per_prompt",
        )

    @property
    def prompts_per_generation_batch(self) -> int:
        """Prompts per generation batch (dynamic sampling's loops draw more, `RewardedLoopConfig`)."""
        return self.num_prompts_per_step

    @property
    def fills_without_signal(self) -> bool:
        """Whether dynamic sampling fills a batch short of groups with signal (a key of GRPO's only)."""
        return False


@dataclass
class RewardShapingConfig(SectionReads):
    """Response-length shaping, enabled by ``enabled``: DAPO's overlong penalty (responses longer than
    max_response_length - buffer lose up to ``overlong_buffer_penalty``) or, when ``stop_properly_penalty_coef`` is
    set, ProRL's "stop properly" penalty in its place (a truncated response's reward times the coefficient), as in
    NeMo-RL, where the coefficient takes precedence over the overlong keys."""

    enabled: bool = False
    overlong_buffer_length: int = 128  # the penalty grows linearly over the last this many tokens before the limit
    overlong_buffer_penalty: float = 1.0
    max_response_length: int | None = None  # DAPO's limit in response tokens (required for its penalty)
    stop_properly_penalty_coef: float | None = None

    def check(self) -> list[tuple[str, str]]:
        problems = []
        coef = self.stop_properly_penalty_coef
        if self.enabled and coef is None and self.max_response_length is None:
            problems.append(("max_response_length", "required when reward_shaping.enabled is true"))
        if coef is not None and not 0.0 <= coef <= 1.0:
            problems.append(("stop_properly_penalty_coef", f"must be in [0, 1] or null, got {coef}"))
        return problems


@dataclass
class RewardScalingConfig(SectionReads):
    """Linear map of rewards from [source_min, source_max] to [target_min, target_max] (clamped)."""

    enabled: bool = False  # scale each sample's environment reward before shaping and advantages
    source_min: float = 0.0  # rewards below are clamped to it first
    source_max: float = 1.0  # rewards above are clamped to it first
    target_min: float = 0.0  # what source_min maps to
    target_max: float = 1.0  # what source_max maps to

    def check(self) -> list[tuple[str, str]]:
        if self.enabled and self.source_max <= self.source_min:
            return [("source_max", f"must be > source_min ({self.source_max} <= {self.source_min})")]
        return []


@dataclass
class RewardedLoopConfig(RolloutLoopConfig):
    """The keys of a loop that trains on rewards (``grpo``, ``ppo``): sample filtering, DAPO's dynamic sampling, the
    reference pass, reward scaling and shaping."""

    overlong_filtering: bool = False  # truncated responses train nothing (sample_mask 0)
    # DAPO's dynamic sampling: a step trains only prompt groups whose rewards differ, generating more batches to fill.
    use_dynamic_sampling: bool = False
    dynamic_sampling_max_gen_batches: int = 10  # generation batches per step before dynamic sampling gives up
    # With dynamic sampling, each generation batch draws int(num_prompts_per_step * batch_multiplier) prompts, so
    # that enough groups with signal remain after filtering (NeMo-RL's key; without dynamic sampling it must be 1).
    batch_multiplier: float = 1.0
    # NeMo-RL's switch to leave out the reference pass; it needs loss_fn.reference_policy_kl_penalty 0, where the
    # pass is left out anyway here (the KL term is the only reader of the reference logprobs).
    skip_reference_policy_logprobs_calculation: bool = False
    reward_shaping: RewardShapingConfig = field(default_factory=RewardShapingConfig)
    reward_scaling: RewardScalingConfig = field(default_factory=RewardScalingConfig)

    @property
    def prompts_per_generation_batch(self) -> int:
        """Prompts per generation batch: ``num_prompts_per_step``, times ``batch_multiplier`` (rounded down)."""
        return int(self.num_prompts_per_step * self.batch_multiplier)


# A loop that trains on no reward (distillation) reads these: nothing filtered, rewards as the environment gave them.
_NO_REWARD_KEYS = RewardedLoopConfig()


def reward_keys(loop: RolloutLoopConfig) -> RewardedLoopConfig:
    """The reward keys of ``loop``: its own, or their inert defaults for a loop without them."""
    return loop if isinstance(loop, RewardedLoopConfig) else _NO_REWARD_KEYS


class RolloutRunConfig(Protocol):
    """What the rollout machinery reads of a run's whole config (each algorithm's master config has it)."""

    policy: Any
    data: Any
    env: Any
    logger: Any
    checkpointing: Any
    cluster: Any
    watchdog: Any

    @property
    def loop(self) -> RolloutLoopConfig: ...

    @property
    def needs_reference_model(self) -> bool: ...


def rollout_problems(config: RolloutRunConfig, section: str, title: str) -> list[tuple[str, str]]:
    """The checks every rollout-based run needs (``section``: its loop section's key, ``title``: the algorithm's
    name): the rollout batch fills whole optimizer steps, the engines have a generation section, the prompts fit, and
    an environment scores the rows."""
    problems = []
    loop = config.loop
    rollout_batch = loop.num_prompts_per_step * loop.num_generations_per_prompt
    gbs = config.policy.train_global_batch_size
    if gbs >= 1 and rollout_batch % gbs:
        problems.append(
            (
                "policy.train_global_batch_size",
                f"must divide {section}.num_prompts_per_step * {section}.num_generations_per_prompt = {rollout_batch} "
                f"(got {gbs})",
            )
        )
    if config.policy.generation is None:
        problems.append(("policy.generation", f"{title} needs a generation section"))
    elif config.policy.generation.backend == "megatron" and not config.policy.megatron_cfg.enabled:
        problems.append(
            (
                "policy.generation.backend",
                "megatron samples with the Megatron policy's workers: set policy.megatron_cfg.enabled=true",
            )
        )
    if config.data.max_input_seq_length > config.policy.max_total_sequence_length:
        problems.append(
            (
                "data.max_input_seq_length",
                f"exceeds policy.max_total_sequence_length ({config.data.max_input_seq_length} > "
                f"{config.policy.max_total_sequence_length})",
            )
        )
    if config.data.task_name not in config.env:
        key = "data.env_name" if config.data.env_name else "data.dataset_name"
        problems.append(
            (
                f"env.{config.data.task_name}",
                f"required: this environment scores the rows ({key}: {getattr(config.data, key[5:])!r}); "
                f"configured environments: {', '.join(config.env) or 'none'}",
            )
        )
    return problems


def clipped_pg_problems(config: Any, section: str) -> list[tuple[str, str]]:
    """The checks of a run whose actor trains with the clipped policy-gradient loss (GRPO, PPO): the KL term needs
    the reference pass, and ``loss_fn.force_on_policy_ratio`` needs one optimizer step per rollout batch."""
    problems = []
    if config.loop.skip_reference_policy_logprobs_calculation and config.loss_fn.uses_reference_kl:
        problems.append(
            (
                f"{section}.skip_reference_policy_logprobs_calculation",
                "needs loss_fn.reference_policy_kl_penalty=0: the KL term reads the reference logprobs",
            )
        )
    rollout_batch = config.loop.num_prompts_per_step * config.loop.num_generations_per_prompt
    gbs = config.policy.train_global_batch_size
    if config.loss_fn.force_on_policy_ratio and gbs != rollout_batch:
        problems.append(
            (
                "loss_fn.force_on_policy_ratio",
                f"needs one optimizer step per rollout batch: policy.train_global_batch_size ({gbs}) must equal "
                f"{section}.num_prompts_per_step * {section}.num_generations_per_prompt ({rollout_batch})",
            )
        )
    megatron = config.policy.megatron_cfg
    if megatron.enabled and megatron.use_linear_ce_fusion_loss:
        problems.append(
            (
                "policy.megatron_cfg.use_linear_ce_fusion_loss",
                f"not supported yet with {section}'s clipped policy-gradient loss (as in NeMo-RL, it serves SFT and "
                "DPO); set it to false",
            )
        )
    return problems


def needs_reference_pass(loss_fn: Any, loop: RolloutLoopConfig) -> bool:
    """Whether each step computes the reference policy's logprobs (so the policy holds a reference model): the
    loss has a KL term and ``skip_reference_policy_logprobs_calculation`` is off."""
    return bool(loss_fn.uses_reference_kl) and not reward_keys(loop).skip_reference_policy_logprobs_calculation
