"""Policy backends: which worker class trains the policy, and what it can do (its capability table).

A run's backend is `policy_backend(config)`: ``policy.backend`` when set (ours: a registered name or an import path
``"package.module:ATTRIBUTE"`` to a `PolicyBackend`), else derived from NeMo-RL's switches, ``megatron_cfg.enabled``
→ ``"megatron"``, otherwise ``"dtensor"``, so NeMo-RL's recipes choose as they do there. Config checks, the dry run,
pre-flight and the tools read the capability table instead of asking which backend it is.

    POLICY_BACKENDS.register("mine", PolicyBackend(worker="my_pkg.worker.MyWorker", section="dtensor_cfg", ...))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nemo_rl_clone.utils.registry import Registry

if TYPE_CHECKING:
    from nemo_rl_clone.models.policy.config import PolicyConfig


@dataclass(frozen=True)
class PolicyBackend:
    """A policy backend's worker and capability table (every flag: what `Policy` and the checks may ask of it)."""

    title: str  # how messages name it ("the {title} backend")
    worker: str  # "package.module.Class" of the Ray worker, built with `Policy`'s arguments
    section: str  # the policy config section it reads ("dtensor_cfg" or "megatron_cfg"): parallel layout, env_vars
    torch_optimizer: bool  # trains with policy.optimizer / policy.scheduler (false: builds its own from `section`)
    topk_logits: bool  # Policy.get_topk_logits (distillation's teacher and student)
    value_head: bool  # scalar-head models: reward models, PPO's critic (reward_model_cfg.enabled)
    sequence_packing: bool  # policy.sequence_packing
    lora: bool  # dtensor_cfg.lora_cfg
    context_parallel: bool  # dtensor_cfg.context_parallel_size > 1 (megatron_cfg's is the Megatron worker's own)
    expert_parallel: bool  # experts sharded over ranks (MoE)
    hf_config_overrides: bool  # policy.hf_config_overrides applied to the model it builds
    ppo_actor: bool  # PPO's actor: the critic's warm-up steps leave it without an optimizer step, then it saves
    step_replay: bool  # replayed in one process from a step's repro bundle (docs/debugging.md)
    calibrated_memory: bool  # the dry run's memory plan is calibrated on measured runs of this worker
    checkpoint_format: str  # "torch_dcp" (HF parameter names) or "megatron_dist" (Megatron distributed checkpoint)


DTENSOR = PolicyBackend(
    title="DTensor",
    worker="nemo_rl_clone.models.policy.dtensor.policy_worker.DTensorPolicyWorker",
    section="dtensor_cfg",
    torch_optimizer=True,
    topk_logits=True,
    value_head=True,
    sequence_packing=True,
    lora=True,
    context_parallel=True,
    expert_parallel=True,
    hf_config_overrides=True,
    ppo_actor=True,
    step_replay=True,
    calibrated_memory=True,
    checkpoint_format="torch_dcp",
)
MEGATRON = PolicyBackend(
    title="Megatron",
    worker="nemo_rl_clone.models.policy.megatron.policy_worker.MegatronPolicyWorker",
    section="megatron_cfg",
    torch_optimizer=False,
    topk_logits=True,
    value_head=True,
    sequence_packing=True,
    lora=False,
    context_parallel=False,
    expert_parallel=True,
    hf_config_overrides=True,
    ppo_actor=True,
    step_replay=False,
    calibrated_memory=False,
    checkpoint_format="megatron_dist",
)

POLICY_BACKENDS: Registry[PolicyBackend] = Registry("policy backend", "policy.backend")
POLICY_BACKENDS.register("dtensor", DTENSOR)
POLICY_BACKENDS.register("megatron", MEGATRON)


def policy_backend(config: PolicyConfig | Mapping[str, Any]) -> str:
    """The backend a ``policy`` section uses (a validated config, or a run's saved section as a mapping)."""
    if isinstance(config, Mapping):
        megatron = config.get("megatron_cfg")
        explicit = config.get("backend")
        derived_megatron = isinstance(megatron, Mapping) and bool(megatron.get("enabled"))
    else:
        explicit, derived_megatron = config.backend, config.megatron_cfg.enabled
    if explicit:
        return str(explicit)
    return "megatron" if derived_megatron else "dtensor"


def backend_spec(config: PolicyConfig | Mapping[str, Any]) -> PolicyBackend:
    """The `PolicyBackend` the section uses (an import path is imported now)."""
    return POLICY_BACKENDS.resolve(policy_backend(config))


def known_backend_spec(config: PolicyConfig) -> PolicyBackend | None:
    """The registered backend's table without importing anything; None for an import path (checked at build)."""
    name = policy_backend(config)
    return POLICY_BACKENDS.resolve(name) if name in POLICY_BACKENDS else None


def backend_key(config: PolicyConfig | Mapping[str, Any]) -> str:
    """The key (relative to the policy section) that chose the backend: what a refusal of a capability names."""
    explicit = config.get("backend") if isinstance(config, Mapping) else config.backend
    if explicit:
        return "backend"
    return "megatron_cfg.enabled" if policy_backend(config) == "megatron" else "dtensor_cfg.enabled"


@dataclass(frozen=True)
class ParallelLayout:
    """How a backend's workers form a model replica: an inner group (tensor- and/or context-parallel ranks, the
    sharding's "tensor_parallel" axis) times pipeline stages; the data-parallel size is workers / their product."""

    inner_key: str  # the policy key (or product of keys) that sets the inner group's size
    inner_size: int
    pipeline_size: int
    divisor_key: str  # how pre-flight names the product: the key ...
    divisor: str  # ... and its short form

    @property
    def model_parallel_size(self) -> int:
        return self.inner_size * self.pipeline_size


def parallel_layout(config: PolicyConfig, spec: PolicyBackend) -> ParallelLayout:
    """The layout ``spec`` reads from its section (TP × CP ranks hold the same samples on either backend)."""
    if spec.section == "megatron_cfg":
        mcfg = config.megatron_cfg
        # Context-parallel ranks hold the same samples, as tensor-parallel ones do (Megatron's order: tp, cp, dp, pp).
        inner = "tensor_model_parallel_size"
        if mcfg.context_parallel_size > 1:
            inner += " * context_parallel_size"
        divisor = f"{inner} * pipeline_model_parallel_size"
        return ParallelLayout(
            f"megatron_cfg.{inner}",
            mcfg.tensor_model_parallel_size * mcfg.context_parallel_size,
            mcfg.pipeline_model_parallel_size,
            f"megatron_cfg.{divisor}",
            divisor,
        )
    dtensor, tp_key = config.dtensor_cfg, "dtensor_cfg.tensor_parallel_size"
    tp, cp = dtensor.tensor_parallel_size, dtensor.context_parallel_size
    if cp > 1:  # the mesh is (dp, cp, tp): a replica's cp x tp ranks are neighbours and hold the same samples
        inner = "context_parallel_size" if tp == 1 else "tensor_parallel_size * context_parallel_size"
        return ParallelLayout(f"dtensor_cfg.{inner}", cp * tp, 1, f"dtensor_cfg.{inner}", inner)
    return ParallelLayout(tp_key, tp, 1, tp_key, "tensor_parallel_size")
