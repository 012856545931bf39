"""PPO config sections (NeMo-RL v0.7.0's keys and defaults): ``ppo`` (with ``ppo.adv_estimator``) and
``value_loss_fn``.

Keys come from NeMo-RL v0.7.0's ``examples/configs/ppo_math_1B.yaml`` and its ``recipes/llm/ppo-*.yaml``; defaults
are those of NeMo-RL's ``PPOConfig`` / ``GAEConfig`` / ``MseValueLossConfig`` where they differ from the YAML.
``reward_shaping`` and ``reward_scaling`` are the rewarded loops' sections (`nemo_rl_clone.rollout.config`; NeMo-RL's
PPO imports them from GRPO).

Refused when set to anything but their inert value (each names what it would switch on):
``adv_estimator.name: raw_reward`` (advantage = reward, no critic), ``use_dynamic_sampling: true`` and
``batch_multiplier`` ≠ 1 (DAPO dynamic sampling).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from nemo_rl_clone.algorithms.loss.registry import ClippedPGLossSection
from nemo_rl_clone.data.config import DataConfig
from nemo_rl_clone.distributed.virtual_cluster import ClusterConfig
from nemo_rl_clone.environments.config import EnvConfig
from nemo_rl_clone.models.generation.config import GenerationConfig
from nemo_rl_clone.models.policy.backend_checks import scalar_head_problems
from nemo_rl_clone.models.policy.backends import backend_key, known_backend_spec
from nemo_rl_clone.models.policy.config import ROUTER_REPLAY_GRPO_ONLY, PolicyConfig, RewardModelConfig
from nemo_rl_clone.rollout.config import (
    RewardedLoopConfig,
    RolloutLoopConfig,
    clipped_pg_problems,
    needs_reference_pass,
    rollout_problems,
)
from nemo_rl_clone.utils.checkpoint import CheckpointingConfig
from nemo_rl_clone.utils.config_validation import SectionReads, check_at_least, takes_extra_keys
from nemo_rl_clone.utils.logger import LoggerConfig
from nemo_rl_clone.utils.watchdog import WatchdogConfig


def _check_unit_interval(section: object, *names: str) -> list[tuple[str, str]]:
    """A problem for each named field that is set and outside [0, 1]."""
    problems = []
    for name in names:
        value = getattr(section, name)
        if value is not None and not 0.0 <= value <= 1.0:
            problems.append((name, f"must be in [0, 1], got {value}"))
    return problems


@dataclass
class GAEConfig(SectionReads):
    """``ppo.adv_estimator``: GAE over response tokens (`nemo_rl_clone.algorithms.ppo.gae`).

    VAPO (arXiv 2504.05118) decouples λ: the critic's targets use ``gae_lambda_value`` and the policy's advantages
    ``gae_lambda_policy`` (null: ``gae_lambda``). ``length_adaptive_alpha`` > 0 replaces λ_policy per sample by
    1 − 1/(α·l), l the sample's response length (0 when α·l ≤ 1).
    """

    name: Literal["gae", "raw_reward"] = "gae"  # "gae"; raw_reward (the reward as advantage, no critic): refused
    gae_lambda: float = 0.95
    gae_gamma: float = 1.0  # the discount γ per response token, in [0, 1]
    normalize_advantages: bool = True  # whiten the advantages over every response token of the batch
    gae_lambda_value: float | None = None
    gae_lambda_policy: float | None = None
    length_adaptive_alpha: float = 0.0

    def check(self) -> list[tuple[str, str]]:
        problems = _check_unit_interval(self, "gae_lambda", "gae_gamma", "gae_lambda_value", "gae_lambda_policy")
        if self.length_adaptive_alpha < 0:
            problems.append(
                ("length_adaptive_alpha", f"must be >= 0 (0 disables it), got {self.length_adaptive_alpha}")
            )
        if self.name == "raw_reward":
            problems.append(("name", "not supported yet: 'raw_reward' (the reward as advantage, no critic); use 'gae'"))
        return problems

    @property
    def value_lambda(self) -> float:
        """λ of the critic's targets (returns)."""
        return self.gae_lambda if self.gae_lambda_value is None else self.gae_lambda_value

    @property
    def policy_lambda(self) -> float:
        """λ of the policy's advantages when ``length_adaptive_alpha`` is 0."""
        return self.gae_lambda if self.gae_lambda_policy is None else self.gae_lambda_policy


@dataclass(frozen=True)
class MseValueLossConfig(SectionReads):
    """``value_loss_fn`` (NeMo-RL's name and defaults): L = scale · ½ · token mean of the (clipped) squared error.
    ``cliprange`` null or 0 disables the clip (NeMo-RL's ``MseValueLossFn`` clips only when it is > 0)."""

    scale: float = 1.0  # the value loss's weight, >= 0
    cliprange: float | None = None

    def check(self) -> list[tuple[str, str]]:
        problems = []
        if self.scale < 0:
            problems.append(("scale", f"must be >= 0, got {self.scale}"))
        if self.cliprange is not None and self.cliprange < 0:
            problems.append(("cliprange", f"must be >= 0 or null (null or 0: no clipping), got {self.cliprange}"))
        return problems


@dataclass
class PPOConfig(RewardedLoopConfig):
    """``ppo``: the shared loop keys (`RewardedLoopConfig`, NeMo-RL's ``PPOConfig`` defaults) and PPO's own."""

    max_num_epochs: int = 100000
    max_num_steps: int = 100000
    val_period: int = 20
    val_at_start: bool = True
    # True by default in PPO (NeMo-RL): its recipes have no KL term; the run's master config pairs it with
    # loss_fn.reference_policy_kl_penalty.
    skip_reference_policy_logprobs_calculation: bool = True
    # Optimizer passes of the policy over each rollout batch.
    ppo_epochs: int = 4
    # Critic warm-up: steps 0 .. policy_training_start_step - 1 train only the value model.
    policy_training_start_step: int = 0
    adv_estimator: GAEConfig = field(default_factory=GAEConfig)

    def check(self) -> list[tuple[str, str]]:
        problems = super().check() + check_at_least(self, 1, "ppo_epochs", "dynamic_sampling_max_gen_batches")
        problems += check_at_least(self, 0, "policy_training_start_step", "val_period")
        if self.use_dynamic_sampling:
            problems.append(
                (
                    "use_dynamic_sampling",
                    "not supported yet with PPO: DAPO dynamic sampling (dropping prompt groups whose rewards do not "
                    "vary); set it to false",
                )
            )
        if self.batch_multiplier != 1:
            problems.append(
                (
                    "batch_multiplier",
                    f"only applies with use_dynamic_sampling; set it to 1 (got {self.batch_multiplier})",
                )
            )
        return problems

    def trains_policy(self, step: int) -> bool:
        """Whether step ``step`` (0-based) trains the policy; earlier steps train only the critic."""
        return step >= self.policy_training_start_step


def critic_section(value: PolicyConfig) -> PolicyConfig:
    """The ``value`` section the critic is built from: a scalar head read at every token, whatever the Megatron
    section's ``reward_model_cfg`` says (validation requires it on the DTensor backend)."""
    return replace(value, reward_model_cfg=RewardModelConfig(enabled=True, reward_model_type="regression"))


def _value_section() -> PolicyConfig:
    return PolicyConfig(
        reward_model_cfg=RewardModelConfig(enabled=True, reward_model_type="regression"), generation=None
    )


@takes_extra_keys
@dataclass
class PPOMasterConfig(SectionReads):
    """Everything a PPO run reads (NeMo-RL's sections): ``policy`` is the actor, ``value`` the critic — a policy
    section whose ``reward_model_cfg`` is ``{enabled: true, reward_model_type: regression}`` (a scalar head read at
    every token)."""

    ppo: PPOConfig = field(default_factory=PPOConfig)
    loss_fn: ClippedPGLossSection = field(default_factory=lambda: ClippedPGLossSection(reference_policy_kl_penalty=0.0))
    value_loss_fn: MseValueLossConfig = field(default_factory=MseValueLossConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    value: PolicyConfig = field(default_factory=_value_section)
    data: DataConfig = field(default_factory=DataConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    checkpointing: CheckpointingConfig = field(default_factory=CheckpointingConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    @property
    def loop(self) -> RolloutLoopConfig:
        return self.ppo

    def check(self) -> list[tuple[str, str]]:
        problems = clipped_pg_problems(self, "ppo") + rollout_problems(self, "ppo", "PPO")
        if "agent" in self.env:  # agent episodes train with GRPO only (docs/agents.md)
            problems.append(("env.agent", "not supported yet with PPO; agent runs use examples/run_grpo.py"))
        value, critic_backend = self.value, known_backend_spec(self.value)
        if critic_backend is not None and not critic_backend.value_head:
            problems.append(
                (
                    f"value.{backend_key(value)}",
                    f"not supported yet: the {critic_backend.title} backend has no scalar head",
                )
            )
        elif (
            critic_backend is not None
            and critic_backend.section == "megatron_cfg"
            and not value.reward_model_cfg.enabled
        ):
            # NeMo-RL's Megatron value section leaves reward_model_cfg off (its key is the DTensor worker's): the
            # critic is a value head either way (`critic_section`).
            problems += [(f"value.{key}", message) for key, message in scalar_head_problems(critic_section(value))]
        elif not (value.reward_model_cfg.enabled and value.reward_model_cfg.reward_model_type == "regression"):
            problems.append(
                (
                    "value.reward_model_cfg",
                    "the critic is a scalar head read at every token: set enabled: true, reward_model_type: regression",
                )
            )
        actor_backend = known_backend_spec(self.policy)
        if actor_backend is not None and not actor_backend.ppo_actor:
            # Untested there: the critic's warm-up steps leave the actor's distributed optimizer without a step, and
            # Megatron's optimizer state cannot be saved before its first step.
            problems.append(
                (f"policy.{backend_key(self.policy)}", "not supported yet: PPO's actor runs on the DTensor backend")
            )
        if self.policy.reward_model_cfg.enabled:
            problems.append(("policy.reward_model_cfg.enabled", "must be false: the actor is a language model"))
        for who in ("policy", "value"):
            if getattr(self, who).router_replay.enabled:
                problems.append((f"{who}.router_replay.enabled", ROUTER_REPLAY_GRPO_ONLY))
        if self.ppo.ppo_epochs > 1 and self.loss_fn.force_on_policy_ratio:
            problems.append(
                (
                    "loss_fn.force_on_policy_ratio",
                    f"must be false with ppo.ppo_epochs={self.ppo.ppo_epochs}: later passes need the ratio against the "
                    "rollout policy's logprobs, not against themselves",
                )
            )
        if value.max_total_sequence_length < self.policy.max_total_sequence_length:
            problems.append(
                (
                    "value.max_total_sequence_length",
                    "must be >= policy.max_total_sequence_length: the critic reads the actor's whole samples",
                )
            )
        if value.generation not in (None, GenerationConfig()):
            problems.append(("value.generation", "the critic generates nothing; set it to null"))
        return problems

    @property
    def needs_reference_model(self) -> bool:
        """Whether each step computes the reference policy's logprobs (the actor's loss has a KL term and
        ``ppo.skip_reference_policy_logprobs_calculation`` is off)."""
        return needs_reference_pass(self.loss_fn, self.ppo)

    @property
    def needs_prev_logprobs(self) -> bool:
        """Whether each step computes the actor's pre-update logprobs (the loss's ratio reads them unless
        ``loss_fn.force_on_policy_ratio``)."""
        return not self.loss_fn.force_on_policy_ratio


# NeMo-RL's name: `from nemo_rl_clone.algorithms.ppo import MasterConfig, setup, ppo_train`.
MasterConfig = PPOMasterConfig
