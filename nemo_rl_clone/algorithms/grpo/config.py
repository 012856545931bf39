"""GRPO config: the ``grpo`` section and the whole-run schema that ``examples/run_grpo_math.py`` validates."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from nemo_rl_clone.algorithms.loss.registry import ClippedPGLossSection
from nemo_rl_clone.data.config import DataConfig
from nemo_rl_clone.distributed.virtual_cluster import ClusterConfig
from nemo_rl_clone.environments.config import EnvConfig
from nemo_rl_clone.models.policy.config import PolicyConfig
from nemo_rl_clone.rollout.config import (
    RewardedLoopConfig,
    RolloutLoopConfig,
    clipped_pg_problems,
    needs_reference_pass,
    rollout_problems,
)
from nemo_rl_clone.rollout.monitor_config import MonitorsConfig
from nemo_rl_clone.utils.checkpoint import CheckpointingConfig
from nemo_rl_clone.utils.config_validation import SectionReads, takes_extra_keys
from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.utils.logger import LoggerConfig
from nemo_rl_clone.utils.watchdog import WatchdogConfig

# Built-in environments with one reward per sample (a user's env_class may return several: GDPO checks at run time).
SINGLE_REWARD_ENVS = (
    "math",
    "reasoning_gym",
    "sliding_puzzle_game",
    "tool_use",
    "code",
    "code_jaccard",
    "reward_model",
    "agent",
)
_BUILT_IN_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus", "gdpo", "opd")


@dataclass
class AdvEstimatorConfig(SectionReads):
    """``grpo.adv_estimator`` (NeMo-RL v0.7.0): which advantage estimator (`algorithms/advantage_estimator.py`), by
    name or as a user's class with NeMo-RL's estimator interface (``package.module.Class``).
    ``normalize_rewards`` / ``use_leave_one_out_baseline`` default to the flat ``grpo.*`` keys and override them
    when set; ``minus_baseline`` is REINFORCE++'s; ``std`` (ours) picks the std GRPO divides by."""

    name: str = "grpo"  # grpo, rloo, reinforce_plus_plus, gdpo, or a class path package.module.Class
    minus_baseline: bool = True
    normalize_rewards: bool | None = None
    use_leave_one_out_baseline: bool | None = None
    # "leave_one_out": NeMo-RL's, the std of the rewards the baseline averaged (per sample with leave-one-out);
    # "group": the whole group's std for every sample (this project's default before 2026-11-27).
    std: Literal["leave_one_out", "group"] = "leave_one_out"

    def check(self) -> list[tuple[str, str]]:
        problems = []
        if self.name not in _BUILT_IN_ESTIMATORS:
            problems += self._check_user_class()
        if self.name == "opd":
            problems.append(
                (
                    "name",
                    "not supported yet: 'opd' (NeMo-RL's multi-teacher on-policy distillation inside GRPO); for "
                    "on-policy distillation run examples/run_distillation_math.py",
                )
            )
        if not self.minus_baseline and self.name != "reinforce_plus_plus" and self.name in _BUILT_IN_ESTIMATORS:
            problems.append(
                (
                    "minus_baseline",
                    f"not supported yet with {self.name!r}: only reinforce_plus_plus can skip the baseline; set it "
                    "to true",
                )
            )
        return problems

    def _check_user_class(self) -> list[tuple[str, str]]:
        if "." not in self.name:
            names = ", ".join(repr(name) for name in _BUILT_IN_ESTIMATORS)
            return [("name", f"must be one of {names} or a class path package.module.Class, got {self.name!r}")]
        # A user's class is imported here (its interface is checked before the run starts); torch comes with it.
        from nemo_rl_clone.algorithms.advantage_estimator import estimator_class

        try:
            found = estimator_class(self.name)
        except ImportError as error:
            return [("name", str(error))]
        except UserInputError as error:
            return [("name", str(error).partition(": ")[2])]
        if not isinstance(found, type) or not callable(getattr(found, "compute_advantage", None)):
            return [("name", f"{self.name} is not a class with compute_advantage(prompt_ids, rewards, mask, **kwargs)")]
        return []


@dataclass
class AsyncGRPOConfig(SectionReads):
    """Async GRPO (`nemo_rl_clone.rollout.async_rollouts`): the engines generate the next steps' rollouts while the
    trainer trains, on rollouts at most ``max_trajectory_age_steps`` training steps old."""

    enabled: bool = False  # the engines generate ahead while the trainer trains
    max_trajectory_age_steps: int = 1
    in_flight_weight_updates: bool = False  # refit the engines while requests run (they go on with the new weights)
    recompute_kv_cache_after_weight_updates: bool = False  # refused: running requests keep their KV cache

    def check(self) -> list[tuple[str, str]]:
        if not self.enabled:
            return []
        problems = []
        if self.max_trajectory_age_steps < 1:
            problems.append(
                (
                    "max_trajectory_age_steps",
                    f"must be >= 1 with async GRPO (got {self.max_trajectory_age_steps}; 0 is synchronous GRPO: set "
                    "async_grpo.enabled=false)",
                )
            )
        if self.recompute_kv_cache_after_weight_updates:
            problems.append(
                (
                    "recompute_kv_cache_after_weight_updates",
                    "not supported yet: requests running during an in-flight weight update go on with their KV "
                    "cache; set it to false",
                )
            )
        return problems


@dataclass
class GRPOConfig(RewardedLoopConfig):
    """``grpo``: the shared loop keys (`RewardedLoopConfig`) and GRPO's own."""

    normalize_rewards: bool = True  # divide advantages by the group's reward std (adv_estimator.std)
    use_leave_one_out_baseline: bool = True  # baseline: the mean of the group's other samples, not of all
    # Ours, not NeMo-RL's: when dynamic sampling finds too few groups with signal in time, fill the batch with groups
    # that train nothing instead of stopping the run (NeMo-RL's behaviour, the default).
    dynamic_sampling_fill_without_signal: bool = False
    # Advantages are clamped into [advantage_clip_low, advantage_clip_high] (null: that side is open).
    advantage_clip_low: float | None = None
    advantage_clip_high: float | None = None  # the clamp's upper bound
    invalid_tool_call_advantage: float | None = None  # NeMo-Gym's flagged messages' fixed advantage: only null
    malformed_thinking_advantage: float | None = None  # NeMo-Gym's flagged messages' fixed advantage: only null
    # Samples whose mean per-token exp|lp_gen − lp_prev| (the token_mult_prob_error of that sequence) exceeds this
    # train nothing (sample_mask 0); null keeps every sample.
    seq_logprob_error_threshold: float | None = None
    # Ours: steps whose repro bundle is written even when nothing trips (docs/debugging.md); their previous step
    # is checkpointed so that the bundle holds the weights the step started from.
    dump_steps: list[int] = field(default_factory=list)
    # Ours: greedy rollouts (temperature 0 or top_k 1) make a group's samples identical, so every advantage is 0 and
    # nothing is learned; refused with several generations per prompt unless this is true (e.g. an environment
    # whose rewards are random on their own).
    allow_greedy_groups: bool = False
    adv_estimator: AdvEstimatorConfig = field(default_factory=AdvEstimatorConfig)
    async_grpo: AsyncGRPOConfig = field(default_factory=AsyncGRPOConfig)

    def check(self) -> list[tuple[str, str]]:
        problems = super().check()
        if self.async_grpo.enabled and self.use_dynamic_sampling:
            problems.append(
                ("use_dynamic_sampling", "not supported with async GRPO (one prompt batch per step); set it to false")
            )
        if self.batch_multiplier != 1 and not self.use_dynamic_sampling:
            problems.append(
                (
                    "batch_multiplier",
                    f"only applies with use_dynamic_sampling; set it to 1 (got {self.batch_multiplier})",
                )
            )
        elif self.prompts_per_generation_batch < self.num_prompts_per_step:
            problems.append(("batch_multiplier", f"must be >= 1 (got {self.batch_multiplier})"))
        if self.leave_one_out and self.num_generations_per_prompt == 1:
            problems.append(("use_leave_one_out_baseline", "needs num_generations_per_prompt >= 2"))
        low, high = self.advantage_clip_low, self.advantage_clip_high
        if low is not None and high is not None and low > high:
            problems.append(("advantage_clip_low", f"must be <= advantage_clip_high ({low} > {high})"))
        # NeMo-RL sets these advantages on messages NeMo-Gym flagged (is_invalid_tool_call, has_malformed_thinking)
        # and refuses them without NeMo-Gym, which only sets the flags.
        for key, what in (
            ("invalid_tool_call_advantage", "a fixed advantage for messages with an invalid tool call"),
            ("malformed_thinking_advantage", "a fixed advantage for messages with malformed thinking"),
        ):
            if getattr(self, key) is not None:
                problems.append((key, f"not supported yet: {what} (NeMo-Gym's message flags); set it to null"))
        threshold = self.seq_logprob_error_threshold
        if threshold is not None and threshold < 1:
            problems.append(("seq_logprob_error_threshold", f"must be >= 1 (1 is exact agreement), got {threshold}"))
        if any(step < 1 for step in self.dump_steps):
            problems.append(("dump_steps", f"must be step numbers >= 1, got {self.dump_steps}"))
        return problems

    @property
    def fills_without_signal(self) -> bool:
        return self.dynamic_sampling_fill_without_signal

    @property
    def normalize(self) -> bool:
        """Whether advantages are divided by the group std (``adv_estimator`` overrides the flat key when set)."""
        value = self.adv_estimator.normalize_rewards
        return self.normalize_rewards if value is None else value

    @property
    def leave_one_out(self) -> bool:
        """Whether the baseline leaves the sample out (``adv_estimator`` overrides the flat key when set)."""
        value = self.adv_estimator.use_leave_one_out_baseline
        return self.use_leave_one_out_baseline if value is None else value


@dataclass
class DataPlaneConfig(SectionReads):
    """NeMo-RL's ``data_plane``: with ``enabled``, the trainer's rows live in TransferQueue's storage units and the
    driver hands the policy workers keys (docs/data_plane.md). NeMo-RL's ``run_grpo.py`` reads it as a dict from the
    master config ``setup`` returns (``master_config.data_plane.get("enabled")``)."""

    enabled: bool = False
    impl: str = "transfer_queue"  # the data plane's engine: only transfer_queue
    # TransferQueue's storage: "simple" (its in-memory storage units) is built; "mooncake_cpu" is refused.
    backend: str = "simple"
    num_storage_units: int = 2  # storage actors, spread round-robin over the cluster's nodes
    storage_capacity: int = 1_000_000  # rows the storage units hold at most, over all units
    # Mooncake's sizes: read only by the mooncake_cpu backend.
    global_segment_size: int = 512 * 2**30
    local_buffer_size: int = 64 * 2**30  # bytes; Mooncake's too
    # NeMo-RL's poll cadence of a worker claiming rows; here the driver hands each rank its rows, nothing claims.
    claim_meta_poll_interval_s: float = 0.5

    def check(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        if self.impl != "transfer_queue":
            problems.append(("impl", f"{self.impl!r} is not a data plane; use transfer_queue"))
        if self.backend == "mooncake_cpu":
            if self.enabled:
                problems.append(
                    (
                        "backend",
                        "not supported yet: TransferQueue's Mooncake store (mooncake_cpu, its transfer engine built "
                        "for RDMA and CUDA hosts); use simple",
                    )
                )
        elif self.backend != "simple":
            problems.append(("backend", f"{self.backend!r} is not a TransferQueue backend; use simple"))
        for key in ("num_storage_units", "storage_capacity", "global_segment_size", "local_buffer_size"):
            if getattr(self, key) < 1:
                problems.append((key, f"must be at least 1, got {getattr(self, key)}"))
        if self.claim_meta_poll_interval_s != 0.5:
            problems.append(
                (
                    "claim_meta_poll_interval_s",
                    "not supported yet: workers claiming rows (the driver hands each rank its rows); leave it 0.5",
                )
            )
        return problems


@takes_extra_keys
@dataclass
class GRPOMasterConfig(SectionReads):
    """Everything a GRPO run reads; each section is validated by its own schema."""

    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    loss_fn: ClippedPGLossSection = field(default_factory=ClippedPGLossSection)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    data: DataConfig = field(default_factory=DataConfig)
    env: EnvConfig = field(default_factory=EnvConfig)  # one section per environment (keyed by the rows' task_name)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    checkpointing: CheckpointingConfig = field(default_factory=CheckpointingConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    data_plane: DataPlaneConfig = field(default_factory=DataPlaneConfig)
    # Not a NeMo-RL section: collapse warnings and monitor/* metrics (docs/monitors.md).
    monitors: MonitorsConfig = field(default_factory=MonitorsConfig)
    on_policy_distillation: Any = None  # NeMo-RL's section: only null (examples/run_distillation_math.py runs it)

    @property
    def loop(self) -> RolloutLoopConfig:
        return self.grpo

    def check(self) -> list[tuple[str, str]]:
        problems = clipped_pg_problems(self, "grpo") + rollout_problems(self, "grpo", "GRPO")
        if self.on_policy_distillation is not None:
            problems.append(
                (
                    "on_policy_distillation",
                    "not supported by GRPO runs: on-policy distillation is its own run; use "
                    "examples/run_distillation_math.py, and set it to null here",
                )
            )
        if (greedy := self.identical_groups) is not None:
            key, what = greedy
            problems.append(
                (
                    key,
                    f"{what} samples greedily: the {self.grpo.num_generations_per_prompt} generations of a prompt are "
                    "identical, so every advantage is 0 and GRPO learns nothing; sample (e.g. temperature 1.0), or "
                    "set grpo.allow_greedy_groups=true if the rewards vary on their own",
                )
            )
        if self.grpo.adv_estimator.name == "gdpo" and self.data.task_name in SINGLE_REWARD_ENVS:
            problems.append(
                (
                    "grpo.adv_estimator.name",
                    f"'gdpo' needs several reward components per sample, which env.{self.data.task_name} does not "
                    "return (env.math_multi_reward does); use 'grpo'",
                )
            )
        generation = self.policy.generation
        if generation is not None and generation.backend == "megatron":
            for key, why in (
                ("grpo.async_grpo.enabled", self.grpo.async_grpo.enabled),
                ("env.agent", "agent" in self.env),
            ):
                if why:
                    problems.append((key, "not supported yet with policy.generation.backend megatron (it needs vLLM)"))
        if self.grpo.async_grpo.enabled:
            problems += self._check_async()
        if "agent" in self.env:
            problems += self._check_agent()
        if self.policy.router_replay.enabled:
            problems += self._check_router_replay()
        if self.policy.reward_model_cfg.enabled:
            problems.append(("policy.reward_model_cfg.enabled", "must be false: GRPO trains a language model"))
        return problems

    @property
    def needs_reference_model(self) -> bool:
        """Whether each step computes the reference policy's logprobs (so the policy holds a reference model): the
        loss has a KL term and ``grpo.skip_reference_policy_logprobs_calculation`` is off."""
        return needs_reference_pass(self.loss_fn, self.grpo)

    @property
    def needs_prev_logprobs(self) -> bool:
        """Whether each step computes the pre-update policy's logprobs before training: the loss's ratio reads them
        unless ``loss_fn.force_on_policy_ratio``, and ``grpo.seq_logprob_error_threshold`` compares them with the
        engines'."""
        return not self.loss_fn.force_on_policy_ratio or self.grpo.seq_logprob_error_threshold is not None

    @property
    def identical_groups(self) -> tuple[str, str] | None:
        """``(key, setting)`` that makes every group's generations identical (greedy sampling with several per
        prompt) unless ``grpo.allow_greedy_groups``; None when groups can differ."""
        generation = self.policy.generation
        if generation is None or self.grpo.num_generations_per_prompt < 2 or self.grpo.allow_greedy_groups:
            return None
        if generation.temperature == 0:
            return "policy.generation.temperature", "temperature 0"
        if generation.top_k == 1:
            return "policy.generation.top_k", "top_k 1"
        return None

    def _check_agent(self) -> list[tuple[str, str]]:
        """``env.agent``: the agent reaches the policy through the engines' HTTP servers and plays every episode."""
        problems = [
            (f"env.{name}", "an agent run's episodes are all the agent's; set this section to null")
            for name in self.env
            if name != "agent"
        ]
        vllm_cfg = self.policy.generation.vllm_cfg if self.policy.generation is not None else None
        for key in ("async_engine", "expose_http_server"):
            if vllm_cfg is not None and not getattr(vllm_cfg, key):
                problems.append((f"policy.generation.vllm_cfg.{key}", "must be true with env.agent (docs/agents.md)"))
        if self.grpo.async_grpo.enabled:
            problems.append(("grpo.async_grpo.enabled", "not supported yet with env.agent; set it to false"))
        if self.loss_fn.force_on_policy_ratio:
            problems.append(
                (
                    "loss_fn.force_on_policy_ratio",
                    "must be false with env.agent: an episode that rewrites its context trains as several samples, "
                    "which can take more than one optimizer step, and later steps need the ratio to the rollout's "
                    "logprobs",
                )
            )
        return problems

    def _check_router_replay(self) -> list[tuple[str, str]]:
        """``policy.router_replay``: the in-process engine records routing (routing_capture.py) and the policy
        workers (DTensor and Megatron) replay it; multi-turn samples merge their turns' records (merge_routing)."""
        why = "with policy.router_replay.enabled (docs/moe.md#router-replay)"
        problems = []
        generation = self.policy.generation
        if generation is not None and generation.vllm_cfg.async_engine:
            problems.append(
                ("policy.generation.vllm_cfg.async_engine", f"not supported yet {why}: the in-process engine records")
            )
        return problems

    def _check_async(self) -> list[tuple[str, str]]:
        problems = []
        generation = self.policy.generation
        if generation is not None and generation.colocated.enabled:
            problems.append(
                (
                    "grpo.async_grpo.enabled",
                    "needs policy.generation.colocated.enabled=false: the engines generate while the trainer trains, "
                    "so they need resources of their own (policy.generation.colocated.resources)",
                )
            )
        if not self.loss_fn.use_importance_sampling_correction:
            problems.append(
                (
                    "loss_fn.use_importance_sampling_correction",
                    "must be true with async GRPO: it trains on rollouts of older weights, and the loss corrects for "
                    "that with the engines' logprobs",
                )
            )
        return problems
