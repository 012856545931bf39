"""Distillation config: the ``distillation`` section and the whole-run schema that
``examples/run_distillation_math.py`` validates (NeMo-RL's keys: ``policy`` is the student, ``teacher`` a second,
frozen policy section)."""

from __future__ import annotations

from dataclasses import dataclass, field

from nemo_rl_clone.algorithms.loss.registry import DistillationLossSection
from nemo_rl_clone.data.config import DataConfig
from nemo_rl_clone.distributed.virtual_cluster import ClusterConfig
from nemo_rl_clone.environments.config import EnvConfig
from nemo_rl_clone.models.policy.backends import backend_key, known_backend_spec
from nemo_rl_clone.models.policy.config import ROUTER_REPLAY_GRPO_ONLY, PolicyConfig
from nemo_rl_clone.rollout.config import RolloutLoopConfig, rollout_problems
from nemo_rl_clone.utils.checkpoint import CheckpointingConfig
from nemo_rl_clone.utils.config_validation import SectionReads, check_at_least, takes_extra_keys
from nemo_rl_clone.utils.logger import LoggerConfig
from nemo_rl_clone.utils.watchdog import WatchdogConfig


@dataclass
class DistillationConfig(RolloutLoopConfig):
    """``distillation``: the shared loop keys (`RolloutLoopConfig`, NeMo-RL's defaults) and the teacher's top-k."""

    num_prompts_per_step: int = 128
    num_generations_per_prompt: int = 1
    max_num_steps: int = 1000
    max_num_epochs: int = 10
    val_period: int = 20
    max_val_samples: int | None = 512
    val_batch_size: int | None = 64
    topk_logits_k: int = 64  # the teacher returns its k largest logits (and their ids) at every position

    def check(self) -> list[tuple[str, str]]:
        return super().check() + check_at_least(self, 1, "topk_logits_k")


@takes_extra_keys
@dataclass
class DistillationMasterConfig(SectionReads):
    """Everything a distillation run reads; each section is validated by its own schema."""

    distillation: DistillationConfig = field(default_factory=DistillationConfig)
    loss_fn: DistillationLossSection = field(default_factory=DistillationLossSection)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    teacher: PolicyConfig = field(default_factory=PolicyConfig)
    data: DataConfig = field(default_factory=DataConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    checkpointing: CheckpointingConfig = field(default_factory=CheckpointingConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    @property
    def loop(self) -> RolloutLoopConfig:
        return self.distillation

    def check(self) -> list[tuple[str, str]]:
        problems = rollout_problems(self, "distillation", "distillation")
        if "agent" in self.env:  # agent episodes train with GRPO only (docs/agents.md)
            problems.append(("env.agent", "not supported yet with distillation; agent runs use examples/run_grpo.py"))
        for who in ("policy", "teacher"):
            section: PolicyConfig = getattr(self, who)
            backend = known_backend_spec(section)
            if backend is not None and not backend.topk_logits:
                problems.append(
                    (
                        f"{who}.{backend_key(section)}",
                        "not supported yet with distillation: this backend has no top-k logits "
                        "(Policy.get_topk_logits); the DTensor and Megatron backends have them",
                    )
                )
            if section.reward_model_cfg.enabled:
                problems.append((f"{who}.reward_model_cfg.enabled", "must be false: distillation uses language models"))
            if section.megatron_cfg.enabled and section.megatron_cfg.use_linear_ce_fusion_loss:
                problems.append(
                    (
                        f"{who}.megatron_cfg.use_linear_ce_fusion_loss",
                        "not supported yet with distillation's KL loss, which reads whole logits (as in NeMo-RL, it "
                        "serves SFT and DPO); set it to false",
                    )
                )
            if section.router_replay.enabled:
                problems.append((f"{who}.router_replay.enabled", ROUTER_REPLAY_GRPO_ONLY))
        if self.teacher.max_total_sequence_length < self.policy.max_total_sequence_length:
            problems.append(
                (
                    "teacher.max_total_sequence_length",
                    "must be >= policy.max_total_sequence_length: the teacher scores the student's whole samples "
                    f"({self.teacher.max_total_sequence_length} < {self.policy.max_total_sequence_length})",
                )
            )
        return problems

    @property
    def needs_reference_model(self) -> bool:
        """The student's loss has no KL term to a reference policy."""
        return False
