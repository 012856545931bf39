"""The policy config's checks that depend on its backend: read from the backend's capability table
(`nemo_rl_clone.models.policy.backends`), each refusal one ``(key, message)`` relative to the policy section."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_rl_clone.models.policy.backends import POLICY_BACKENDS, PolicyBackend, backend_key, known_backend_spec
from nemo_rl_clone.models.policy.megatron.config import check_megatron_against_policy, check_megatron_config

if TYPE_CHECKING:
    from nemo_rl_clone.models.policy.config import PolicyConfig


def check_backend(config: PolicyConfig) -> list[tuple[str, str]]:
    """Exactly one of NeMo-RL's switches on, the chosen backend known, its section, optimizer and model kind. An
    import path is not imported here: its table is checked when the `Policy` builds (`capability_problems`)."""
    dtensor, megatron = config.dtensor_cfg.enabled, config.megatron_cfg.enabled
    if dtensor and megatron:
        return [
            ("megatron_cfg.enabled", "pick one backend: dtensor_cfg.enabled and megatron_cfg.enabled are both true")
        ]
    if not dtensor and not megatron:
        return [
            (
                "dtensor_cfg.enabled",
                "no policy backend: set dtensor_cfg.enabled=true (DTensor/FSDP2) or megatron_cfg.enabled=true "
                "(Megatron Core)",
            )
        ]
    problem = POLICY_BACKENDS.problem(config.backend, "backend") if config.backend else None
    if problem:
        return [("backend", problem.partition(": ")[2])]
    spec = known_backend_spec(config)
    return _section_problems(config, spec) if spec else []


def feature_problems(config: PolicyConfig) -> list[tuple[str, str]]:
    """Sequence packing, LoRA and context parallelism against the registered backend's table (none for an import
    path until the `Policy` builds)."""
    spec = known_backend_spec(config)
    if spec is None:
        return []
    return _check_sequence_packing(config, spec) + _check_lora(config, spec) + _check_context_parallel(config, spec)


def capability_problems(config: PolicyConfig, spec: PolicyBackend) -> list[tuple[str, str]]:
    """Everything ``config`` asks of ``spec`` that its table refuses: what `Policy` checks for an import path."""
    problems = _check_sequence_packing(config, spec) + _check_lora(config, spec) + _check_context_parallel(config, spec)
    if hf_overrides_refused(config, spec):
        problems.append(("hf_config_overrides", f"not supported yet: {hf_overrides_refused(config, spec)}"))
    return problems + _section_problems(config, spec)


def hf_overrides_refused(config: PolicyConfig, spec: PolicyBackend | None) -> str:
    """Why ``hf_config_overrides`` cannot be applied ("" when they can or are unset)."""
    if not config.hf_config_overrides or spec is None or spec.hf_config_overrides:
        return ""
    return (
        f"Hugging Face config overrides with the {spec.title} backend (its converter reads the checkpoint's config); "
        "use dtensor_cfg"
    )


def _section_problems(config: PolicyConfig, spec: PolicyBackend) -> list[tuple[str, str]]:
    key = backend_key(config)
    if not getattr(config, spec.section).enabled:
        return [(f"{spec.section}.enabled", f"the {spec.title} backend ({key}) reads {spec.section}: set it to true")]
    problems = _check_section(config, spec)
    if config.reward_model_cfg.enabled and spec.section == "megatron_cfg":
        problems += scalar_head_problems(config)
    if config.reward_model_cfg.enabled and not spec.value_head:
        # The Megatron converter builds causal LMs (Llama, Qwen2), not the scalar-head sequence classifier.
        problems.append(
            (
                key,
                f"reward models (reward_model_cfg.enabled) are not supported by the {spec.title} backend yet; use "
                "dtensor_cfg.enabled=true",
            )
        )
    return problems


def scalar_head_problems(config: PolicyConfig) -> list[tuple[str, str]]:
    """What a Megatron scalar-head model (reward model, PPO's critic) cannot use."""
    problems = []
    if config.megatron_cfg.use_linear_ce_fusion_loss:
        problems.append(
            ("megatron_cfg.use_linear_ce_fusion_loss", "must be false: a scalar-head model has no vocabulary")
        )
    if config.megatron_cfg.peft.enabled:
        problems.append(("megatron_cfg.peft.enabled", "LoRA for reward models and critics is not supported yet"))
    return problems


def _check_section(config: PolicyConfig, spec: PolicyBackend) -> list[tuple[str, str]]:
    """The optimizer the backend trains with; Megatron's own section (checked only when it is the backend's)."""
    if spec.torch_optimizer and config.optimizer is None:
        return [
            (
                "optimizer",
                f"the {spec.title} backend trains with this torch optimizer; null is only for the Megatron backend "
                "(megatron_cfg.enabled=true), which builds its own",
            )
        ]
    if spec.section != "megatron_cfg":
        return []
    # An inherited policy.optimizer is accepted (NeMo-RL's Megatron worker ignores it too) and named in the log.
    mcfg = config.megatron_cfg
    problems = check_megatron_config(mcfg) + check_megatron_against_policy(mcfg, config.precision, config.max_grad_norm)
    if mcfg.context_parallel_size > 1 and not config.sequence_packing.enabled:
        problems.append(
            (
                "context_parallel_size",
                "context parallelism on the Megatron backend runs packed sequences (as in NeMo-RL); set "
                "policy.sequence_packing.enabled=true",
            )
        )
    return [(f"megatron_cfg.{key}", message) for key, message in problems]


def _check_context_parallel(config: PolicyConfig, spec: PolicyBackend) -> list[tuple[str, str]]:
    """Context parallelism splits plain causal-LM sequences (TP-sharded or not): not packed rows or a score head."""
    size = config.dtensor_cfg.context_parallel_size
    key = "dtensor_cfg.context_parallel_size"
    if size == 1:
        return []
    if size < 1:
        return [(key, f"must be >= 1, got {size}")]
    if spec.section != "dtensor_cfg":
        return []  # the DTensor backend's, inherited: named in the log as unused (NeMo-RL ignores it as well)
    if not spec.context_parallel:
        return [(key, f"context parallelism is not supported by the {spec.title} backend yet")]
    unsupported = [
        (config.sequence_packing.enabled, "sequence_packing (use policy.dynamic_batching)"),
        (config.reward_model_cfg.enabled, "reward models (reward_model_cfg.enabled)"),
    ]
    return [(key, f"context parallelism with {what} is not supported yet") for refused, what in unsupported if refused]


def _check_lora(config: PolicyConfig, spec: PolicyBackend) -> list[tuple[str, str]]:
    """LoRA runs on causal LMs without tensor parallelism (its plan names the plain layers)."""
    if not config.dtensor_cfg.lora_cfg.enabled:
        return []
    key = "dtensor_cfg.lora_cfg.enabled"
    if not spec.lora:
        return [(key, f"dtensor_cfg.lora_cfg is the DTensor backend's LoRA; the {spec.title} backend has no LoRA yet")]
    problems = []
    if config.dtensor_cfg.tensor_parallel_size != 1:
        problems.append((key, "LoRA with dtensor_cfg.tensor_parallel_size > 1 is not supported yet"))
    if config.reward_model_cfg.enabled:
        problems.append((key, "LoRA for reward models (reward_model_cfg.enabled) is not supported yet"))
    return problems


def _check_sequence_packing(config: PolicyConfig, spec: PolicyBackend) -> list[tuple[str, str]]:
    """What packed training supports: a packing backend (DTensor: SDPA attention), bins that fit a sample."""
    packing = config.sequence_packing
    if not packing.enabled:
        return []
    if not spec.sequence_packing:
        return [
            (
                "sequence_packing.enabled",
                f"not supported yet: sequence packing with the {spec.title} backend (the DTensor backend packs); "
                f"with {spec.section} use policy.dynamic_batching to cut padding",
            )
        ]
    problems = []
    dtensor = spec.section == "dtensor_cfg"
    if dtensor and config.dtensor_cfg.hf_attention != "sdpa":
        problems.append(
            (
                "dtensor_cfg.attn_implementation",
                f"sequence packing runs SDPA attention per packed sample; set it to sdpa (got "
                f"{config.dtensor_cfg.hf_attention!r})",
            )
        )
    step = max(packing.sequence_length_round, 1)  # below 1 is reported by SequencePackingConfig.check
    longest = -(-config.max_total_sequence_length // step) * step
    for key in ("train_mb_tokens", "logprob_mb_tokens"):
        budget = getattr(packing, key)
        if budget is not None and 1 <= budget < longest:
            problems.append(
                (
                    f"sequence_packing.{key}",
                    f"{budget} is below {longest}, the cost of a max_total_sequence_length sample (rounded up to "
                    f"sequence_length_round={packing.sequence_length_round}): it would fit no microbatch",
                )
            )
    return problems
