"""Every key a config accepts does something: it is read by the code, or refused when set.

The walk covers every field of every master config (GRPO, SFT, DPO, RM, evaluation), recursively. A field is *read*
when the package reads an attribute of that name (``x.field``, ``getattr(x, "field")``) outside validation code
(functions named ``check``, ``check_*`` or ``_check*``: validation reading a field is not using it), or when a whole
section is handed on (``dataclasses.asdict(x.section)``, ``vars(x.section)``). Matching is by field name, so the walk
catches keys that nothing reads at all (the way ``policy.logprob_chunk_size`` and ``checkpointing.model_save_format``
once validated and did nothing); it cannot tell two sections' ``enabled`` apart.

Fields that are not read must be listed in ``REFUSED`` below, and each refusal is checked by validating a config that
sets it: the one-line error naming the key must come out. ``INERT`` lists the few keys accepted at any value that
do nothing here, each with the reason (docs/policy.md documents them).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nemo_rl_clone.algorithms.distillation.config import DistillationMasterConfig
from nemo_rl_clone.algorithms.dpo import DPOMasterConfig
from nemo_rl_clone.algorithms.grpo.config import (
    AdvEstimatorConfig,
    AsyncGRPOConfig,
    DataPlaneConfig,
    GRPOConfig,
    GRPOMasterConfig,
)
from nemo_rl_clone.algorithms.loss.configs import ClippedPGLossConfig
from nemo_rl_clone.algorithms.rm import RMMasterConfig
from nemo_rl_clone.algorithms.sft import SFTConfig, SFTMasterConfig
from nemo_rl_clone.data.config import (
    DataConfig,
    DataDefaultsConfig,
    DataTrainConfig,
    DataValidationConfig,
    NeMoRLDataLayout,
)
from nemo_rl_clone.environments.config import (
    BUILTIN_ENV_CONFIGS,
    EnvConfig,
    MathEnvConfig,
    RewardModelDTensorConfig,
    RewardModelEnvConfig,
    RewardModelKind,
)
from nemo_rl_clone.evals.config import EvalGenerationConfig, EvalMasterConfig
from nemo_rl_clone.models.generation.config import GenerationConfig, VllmConfig
from nemo_rl_clone.models.policy.config import (
    DraftConfig,
    DTensorConfig,
    LoraConfig,
    PolicyConfig,
    RewardModelConfig,
    RouterReplayConfig,
    SequencePackingConfig,
)
from nemo_rl_clone.models.policy.megatron.config import (
    MegatronConfig,
    MegatronDDPConfig,
    MegatronFP8Config,
    MegatronOptimizerConfig,
    MegatronPeftConfig,
)
from nemo_rl_clone.utils.config_validation import ConfigError, _dataclass_in, validate_config
from nemo_rl_clone.utils.logger import GpuMonitoringConfig, LoggerConfig, SwanlabConfig

PACKAGE = Path(__file__).resolve().parents[2] / "nemo_rl_clone"

# Each master config with the smallest overrides that make its defaults valid.
MASTERS: dict[str, tuple[type, dict[str, Any]]] = {
    "grpo": (GRPOMasterConfig, {}),
    "sft": (SFTMasterConfig, {"policy": {"max_total_sequence_length": 1024}}),
    "dpo": (DPOMasterConfig, {"policy": {"max_total_sequence_length": 1024}}),
    "rm": (RMMasterConfig, {"policy": {"max_total_sequence_length": 1024, "reward_model_cfg": {"enabled": True}}}),
    "eval": (EvalMasterConfig, {"logger": {}}),
    "distillation": (DistillationMasterConfig, {"policy": {"train_global_batch_size": 128}}),
}


@dataclasses.dataclass(frozen=True)
class Refusal:
    value: Any  # a value that is refused
    message: str  # the error after "<dotted key>: "
    masters: tuple[str, ...] = tuple(MASTERS)  # the runs that refuse it (elsewhere the field must be read)
    setup: tuple[tuple[str, Any], ...] = ()  # other (dotted key, value) the refusal needs, e.g. the Megatron backend


# The runs whose data section takes NeMo-RL v0.7.0's nested layout.
DATA_RUNS = ("grpo", "sft", "dpo", "rm", "distillation")
# megatron_cfg is checked only when it is the backend (here: the runs whose smoke configs have a Megatron variant).
MEGATRON_RUNS = ("grpo", "sft", "dpo")
ENV_RUNS = ("grpo", "eval", "distillation")  # the runs with an env section
TO_MEGATRON = (("policy.dtensor_cfg.enabled", False), ("policy.optimizer", None), ("policy.scheduler", None))
MEGATRON = (*TO_MEGATRON, ("policy.megatron_cfg.enabled", True))
_LOCAL_SPEC = "needs Transformer Engine, and this backend builds Megatron's local (non-TE) layer spec"
_SWIGLU_ONLY = "the converter builds SwiGLU models only (Llama, Qwen2, Qwen3, Qwen3-MoE)"
_NO_MTP = "only applies to multi-token prediction"
_NO_OFFLOAD = "optimizer CPU offload in the Megatron backend"
_YET = "not supported yet: "


PEFT = (*MEGATRON, ("policy.megatron_cfg.peft.enabled", True))  # Megatron LoRA on: its other keys are read


def megatron(value: Any, message: str) -> Refusal:
    return Refusal(value, message, MEGATRON_RUNS, MEGATRON)


# (schema class, field) → how setting it is refused. A section refused through its `enabled` key (async GRPO,
# Megatron's fp8_cfg and peft) covers the section's other keys: they are only meaningful when it
# is enabled.
REFUSED: dict[tuple[type, str], Refusal] = {
    (AsyncGRPOConfig, "recompute_kv_cache_after_weight_updates"): Refusal(
        True,
        "not supported yet: requests running during an in-flight weight update go on with their KV cache; set it "
        "to false",
        ("grpo",),
        (("grpo.async_grpo.enabled", True),),
    ),
    (GRPOConfig, "invalid_tool_call_advantage"): Refusal(
        -1.0,
        "not supported yet: a fixed advantage for messages with an invalid tool call (NeMo-Gym's message flags); set it "
        "to null",
        ("grpo",),
    ),
    (GRPOConfig, "malformed_thinking_advantage"): Refusal(
        -1.0,
        "not supported yet: a fixed advantage for messages with malformed thinking (NeMo-Gym's message flags); set it "
        "to null",
        ("grpo",),
    ),
    (AdvEstimatorConfig, "minus_baseline"): Refusal(
        False,
        "not supported yet with 'grpo': only reinforce_plus_plus can skip the baseline; set it to true",
        ("grpo",),
    ),
    (ClippedPGLossConfig, "positive_example_nll_weight"): Refusal(
        0.1, "not supported yet: VAPO's NLL term on positive examples; set it to 0.0", ("grpo",)
    ),
    (ClippedPGLossConfig, "use_kl_in_reward"): Refusal(
        True,
        "not supported yet: the KL penalty is a loss term here (reference_policy_kl_penalty); set it to false",
        ("grpo",),
    ),
    (DataPlaneConfig, "backend"): Refusal(
        "mooncake_cpu",
        "not supported yet: TransferQueue's Mooncake store (mooncake_cpu, its transfer engine built for RDMA and CUDA "
        "hosts); use simple",
        ("grpo",),
        (("data_plane.enabled", True),),
    ),
    (DataPlaneConfig, "claim_meta_poll_interval_s"): Refusal(
        0.1,
        "not supported yet: workers claiming rows (the driver hands each rank its rows); leave it 0.5",
        ("grpo",),
    ),
    (GRPOMasterConfig, "on_policy_distillation"): Refusal(
        {"enabled": True},
        "not supported by GRPO runs: on-policy distillation is its own run; use examples/run_distillation_math.py, "
        "and set it to null here",
        ("grpo",),
    ),
    (DataTrainConfig, "max_samples"): Refusal(
        100, "not supported yet: a cap on the training rows; give a smaller data_path, set null", DATA_RUNS
    ),
    (DataTrainConfig, "output_key"): Refusal(
        "output",
        "not supported yet: 'output'; each dataset reads its own answer column (OpenMathInstruct-2: "
        "generated_solution); set it to null",
        DATA_RUNS,
    ),
    (DataValidationConfig, "split"): Refusal(
        "dev",
        "not supported yet: 'dev'; validation uses the dataset's own validation rows, set 'validation' or null",
        DATA_RUNS,
    ),
    (DataDefaultsConfig, "processor"): Refusal(
        "my_processor",
        "not supported yet: 'my_processor'; the dataset picks its processor here (equivalent to "
        "'math_hf_data_processor', 'math_data_processor', 'sft_processor'); set one of those or null",
        DATA_RUNS,
    ),
    (NeMoRLDataLayout, "use_multiple_dataloader"): Refusal(
        True, "not supported yet: one dataset trains per run here; set it to false", DATA_RUNS
    ),
    (DataConfig, "add_system_prompt"): Refusal(
        True, "not supported yet: give the system prompt as data.default.system_prompt_file", ("grpo", "distillation")
    ),
    (SFTConfig, "only_unmask_final"): Refusal(
        True,
        "not supported yet: training on the final assistant turn only; every assistant turn trains, set it to false",
        ("sft",),
    ),
    (DTensorConfig, "sequence_parallel"): Refusal(
        True,
        "not supported yet with custom_parallel_plan (a custom plan places every activation itself: put the "
        "sequence-parallel styles in it); set it to false",
        setup=(
            ("policy.dtensor_cfg.custom_parallel_plan", "my_plans.llama"),
            ("teacher.dtensor_cfg.custom_parallel_plan", "my_plans.llama"),
        ),
    ),
    (MegatronConfig, "context_parallel_size"): megatron(  # the Megatron smoke runs pad rows (no packing)
        2,
        "context parallelism on the Megatron backend runs packed sequences (as in NeMo-RL); set "
        "policy.sequence_packing.enabled=true",
    ),
    (MegatronConfig, "gradient_accumulation_fusion"): megatron(
        True,
        f"{_YET}needs Apex's fused_weight_gradient_mlp_cuda kernel, which the linear layers of Megatron's local "
        "(non-TE) layer spec that this backend builds would call; it is not installed; set it to false",
    ),
    (MegatronConfig, "use_fused_weighted_squared_relu"): megatron(
        True, f"{_YET}is for squared-ReLU MLPs, and {_SWIGLU_ONLY}; set it to false"
    ),
    (MegatronConfig, "use_linear_ce_fusion_loss"): Refusal(  # SFT and DPO run it (tests/unit/test_megatron_policy.py)
        True,
        "not supported yet with grpo's clipped policy-gradient loss (as in NeMo-RL, it serves SFT and DPO); set it to false",
        ("grpo",),
        MEGATRON,
    ),
    (MegatronConfig, "mtp_num_layers"): megatron(
        1, f"{_YET}multi-token prediction in the Megatron backend; set it to 0 (got 1)"
    ),
    (MegatronConfig, "mtp_loss_scaling_factor"): megatron(0.1, f"{_YET}{_NO_MTP}; set it to 0.0 (got 0.1)"),
    (MegatronConfig, "mtp_use_repeated_layer"): megatron(True, f"{_YET}{_NO_MTP}; set it to false"),
    (MegatronConfig, "mtp_detach_heads"): megatron(True, f"{_YET}{_NO_MTP}; set it to false"),
    **{
        (MegatronPeftConfig, key): Refusal(value, f"{_YET}{why}", MEGATRON_RUNS, PEFT)
        for key, value, why in (
            ("lora_A_init_method", "kaiming", "lora_A_init_method 'kaiming' (xavier only)"),
            (
                "lora_B_init_method",
                "xavier",
                "lora_B_init_method 'xavier' (zero only: the run starts as the base model)",
            ),
            ("a2a_experimental", True, "all-to-all LoRA of MoE experts"),
            ("lora_dtype", "bfloat16", "adapters in a dtype of their own (null: the model's)"),
        )
    },
    (MegatronFP8Config, "enabled"): megatron(True, f"{_YET}FP8 training {_LOCAL_SPEC}; set it to false"),
    (MegatronOptimizerConfig, "optimizer_cpu_offload"): megatron(True, f"{_YET}{_NO_OFFLOAD}; set it to false"),
    (MegatronOptimizerConfig, "optimizer_offload_fraction"): megatron(
        1.0, f"{_YET}{_NO_OFFLOAD}; set it to 0.0 (got 1.0)"
    ),
    (MegatronDDPConfig, "use_custom_fsdp"): megatron(
        True,
        f"{_YET}Megatron's custom FSDP; this backend uses Megatron DDP with the distributed optimizer; set it to false",
    ),
    (MegatronDDPConfig, "data_parallel_sharding_strategy"): megatron(
        "no_shard",
        f"{_YET}only applies to Megatron's custom FSDP; set it to 'optim_grads_params' (got 'no_shard')",
    ),
    (GenerationConfig, "backend"): Refusal(
        "hf", "the 'hf' generation backend is not supported yet; use 'megatron' or 'vllm'"
    ),
    # One value is implemented; the key exists so that NeMo-RL configs naming it validate.
    (RewardModelConfig, "reward_model_type"): Refusal(
        "pairwise", "must be one of ['bradley_terry', 'regression'], got 'pairwise'"
    ),
    (MathEnvConfig, "math_verify_impl"): Refusal(
        "other", "must be one of 'hf_math_verify', 'dapo_math_verify', got 'other'"
    ),
    # NeMo-RL's reward-model environment section carries policy-training keys; the scorer accepts their no-op values.
    (RewardModelKind, "reward_model_type"): Refusal(
        "pairwise", "must be one of ['bradley_terry'], got 'pairwise'", ENV_RUNS
    ),
    (RewardModelDTensorConfig, "sequence_parallel"): Refusal(
        True, "the reward-model environment runs its model in one process; set it to false", ENV_RUNS
    ),
    (RewardModelEnvConfig, "offload_optimizer_for_logprob"): Refusal(
        True, "the reward model has no optimizer here; set it to false", ENV_RUNS
    ),
    # NeMo-RL infrastructure keys whose feature this library lacks: accepted at their no-op value.
    (PolicyConfig, "activation_checkpointing_enabled"): Refusal(
        True,
        "not supported yet: this top-level switch; use policy.dtensor_cfg.activation_checkpointing (or megatron_cfg's)",
    ),
    (PolicyConfig, "dequantize_base_checkpoint"): Refusal(
        True,
        "not supported yet: dequantizing an FP8-quantized base checkpoint on load; start from a bf16/fp32 checkpoint",
    ),
    (PolicyConfig, "offload_optimizer_for_logprob"): megatron(
        True, f"{_YET}with the Megatron backend (its optimizer state stays where it is); use the DTensor backend"
    ),
    (PolicyConfig, "quant_cfg"): Refusal("q.yaml", "not supported yet: ModelOpt quantized training; set it to null"),
    (DraftConfig, "enabled"): Refusal(
        True, "not supported yet: training a speculative-decoding draft model; set it to false"
    ),
    (RouterReplayConfig, "enabled"): Refusal(
        True,
        "router replay is for GRPO runs (it replays the generation engine's routing); set it to false",
        tuple(m for m in MASTERS if m != "grpo"),
    ),
    (DTensorConfig, "dp_replicate_size"): Refusal(
        2,
        "not supported yet with context_parallel_size or expert_parallel_size > 1 (HSDP shards over the plain "
        "data-parallel ranks); set it to 1",
        setup=(("policy.dtensor_cfg.expert_parallel_size", 2), ("teacher.dtensor_cfg.expert_parallel_size", 2)),
    ),
    (GenerationConfig, "quant_cfg"): Refusal(
        "q.yaml", "not supported yet: ModelOpt quantized generation; set it to null"
    ),
    (GenerationConfig, "real_quant"): Refusal(True, "not supported yet: quantized generation kernels; set it to false"),
    (VllmConfig, "expert_parallel_size"): Refusal(
        2,
        "not supported yet: 2 > tensor_parallel_size 1 needs vLLM's data-parallel engine groups; set it to 1 or to "
        "tensor_parallel_size (experts spread over the engine's tensor-parallel ranks)",
    ),
    (VllmConfig, "use_deep_gemm"): Refusal(True, "not supported yet: DeepGEMM FP8 kernels; set it to false"),
    (VllmConfig, "num_first_layers_in_bf16"): Refusal(
        1,
        "not supported yet: FP8 generation (these keep layers in bf16 under precision fp8); set it to 0",
    ),
    (VllmConfig, "num_last_layers_in_bf16"): Refusal(
        1,
        "not supported yet: FP8 generation (these keep layers in bf16 under precision fp8); set it to 0",
    ),
    (VllmConfig, "quantization_ignored_layer_kws"): Refusal(
        ["a_proj"],
        "not supported yet: FP8 generation (these exempt layers from quantization); set it to null",
    ),
    (LoggerConfig, "swanlab_enabled"): Refusal(
        True,
        "not supported yet: SwanLab logging (swanlab is not installed); use wandb_enabled, tensorboard_enabled or "
        "mlflow_enabled",
    ),
    # Read by GRPO only (it prints validation generations); the other runs have none to print.
    (LoggerConfig, "num_val_samples_to_print"): Refusal(
        2, "only GRPO prints validation samples; {run} has none, set it to 0", ("sft", "dpo", "rm", "eval")
    ),
}
# Sections whose `enabled` refusal above covers every other key in them, and the runs where it does.
REFUSED_SECTIONS: dict[type, tuple[str, ...]] = {
    DataPlaneConfig: ("grpo",),
    MegatronFP8Config: MEGATRON_RUNS,
    MegatronConfig: ("rm", "distillation"),  # distillation: refused for the student and the teacher
    DraftConfig: tuple(MASTERS),
    SwanlabConfig: tuple(MASTERS),  # through logger.swanlab_enabled
}

_MOE_AT_START = (
    "MoE models only: the Megatron worker refuses any value but the default by name at start-up, when it has read "
    "the model (models/policy/megatron/moe.py); inert on dense models, where NeMo-RL's recipes set it too"
)
# Accepted at any value and doing nothing here, so that NeMo-RL's recipes (which set them on dense models, where
# NeMo-RL ignores them too) validate unchanged. docs/policy.md lists them.
INERT: dict[tuple[type, str], str] = {
    **{
        (MegatronConfig, name): _MOE_AT_START
        for name in (
            "moe_grouped_gemm",
            "moe_enable_deepep",
            "moe_flex_dispatcher_backend",
            "moe_router_enable_expert_bias",
            "moe_shared_expert_overlap",
            "moe_per_layer_logging",
        )
    },
    (MegatronConfig, "moe_hybridep_num_sms"): "configures the flex dispatcher's HybridEP backend, which is refused",
    (LoraConfig, "use_triton"): "picks NeMo-RL's fused Triton kernel for the same LoRA computation; peft's PyTorch "
    "layers run here",
    (
        MegatronConfig,
        "force_reconvert_from_hf",
    ): "conversion runs in memory at every start-up; there is no cache to force",
    (DTensorConfig, "_v2"): "picks NeMo-RL's second DTensor worker; this library has one DTensor worker",
    (SequencePackingConfig, "fuse_loss"): "NeMo-RL's choice between one loss call over the packed row and one per "
    "sample; here packed logprobs are unpacked and the loss runs once per microbatch either way (same numbers)",
    (PolicyConfig, "generation_batch_size"): "the batch size of NeMo-RL's generation with the policy's own HF model; "
    "generation runs on vLLM here (generation.backend 'hf' is refused)",
    (GenerationConfig, "mcore_generation_config"): "read only by the Megatron generation backend, which is refused",
    (EvalGenerationConfig, "mcore_generation_config"): "read only by the Megatron generation backend, which is refused",
    (VllmConfig, "enable_vllm_metrics_logger"): "NeMo-RL's periodic log of vLLM's internal gauges; metrics only, "
    "generation is the same (throughput and timings are logged here instead)",
    (VllmConfig, "vllm_metrics_logger_interval"): "the period of enable_vllm_metrics_logger",
    (GpuMonitoringConfig, "flush_interval"): "NeMo-RL's period for writing buffered GPU samples; samples are written "
    "when taken here",
    (RewardModelDTensorConfig, "_v2"): "picks NeMo-RL's second DTensor worker; the scorer here is one plain model",
    (RewardModelEnvConfig, "processor"): "names a data processor in NeMo-RL's recipe, which its environment does not "
    "read either; data.processor picks the rows' processor",
}


def walk(schema: type, prefix: str = "") -> Iterator[tuple[str, type, str, Any]]:
    """(dotted key, owning dataclass, field name, field type) of every field, depth first."""
    hints = typing.get_type_hints(schema)
    for field in dataclasses.fields(schema):
        dotted = f"{prefix}.{field.name}" if prefix else field.name
        yield dotted, schema, field.name, hints[field.name]
        inner = _dataclass_in(hints[field.name])
        if inner is not None:
            yield from walk(inner, dotted)
        elif hints[field.name] is EnvConfig:  # open sections: every built-in environment's schema
            for name, section in BUILTIN_ENV_CONFIGS.items():
                yield from walk(section, f"{dotted}.{name}")


class _Reads(ast.NodeVisitor):
    """Attribute names the package reads outside validation code, and sections it hands on whole."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.whole: set[str] = set()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if node.name == "check" or node.name.startswith(("check_", "_check")):
            return
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.ctx, ast.Load):
            self.names.add(node.attr)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if func == "getattr" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            self.names.add(node.args[1].value)
        if func in ("asdict", "vars") and node.args and isinstance(node.args[0], ast.Attribute):
            self.whole.add(node.args[0].attr)
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        # `SupervisedAlgorithm.section` names the config section the shared loop reads with getattr.
        for statement in node.body:
            if (
                isinstance(statement, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "section" for t in statement.targets)
                and isinstance(statement.value, ast.Constant)
            ):
                self.names.add(statement.value.value)
        self.generic_visit(node)


def code_reads(package: Path = PACKAGE) -> _Reads:
    reads = _Reads()
    for path in sorted(package.rglob("*.py")):
        reads.visit(ast.parse(path.read_text(), filename=str(path)))
    return reads


def unused_keys(master: str, reads: _Reads) -> list[str]:
    """Keys of ``master`` that are neither read nor refused there."""
    schema = MASTERS[master][0]
    unused = []
    covered: list[str] = []  # sections read whole or refused whole: their keys need no check
    for dotted, owner, name, tp in walk(schema):
        if any(dotted.startswith(prefix + ".") for prefix in covered):
            continue
        section = _dataclass_in(tp)
        if section is not None and master in REFUSED_SECTIONS.get(section, ()):
            covered.append(dotted)
            continue
        if (owner, name) in INERT:
            continue
        if name in reads.whole:
            covered.append(dotted)
        if section is not None and not dataclasses.fields(section):
            continue  # an empty section (logger.tensorboard) holds no key
        refusal = _refusal(owner, name)
        if refusal is not None and master in refusal.masters:
            continue
        if name not in reads.names and name not in reads.whole:
            unused.append(dotted)
    return unused


def _refusal(owner: type, name: str) -> Refusal | None:
    for (cls, field), refusal in REFUSED.items():
        if issubclass(owner, cls) and field == name:
            return refusal
    return None


@pytest.mark.parametrize("master", list(MASTERS))
def test_every_key_is_read_or_refused(master: str) -> None:
    unused = unused_keys(master, code_reads())
    assert not unused, (
        f"{master}: these keys validate but nothing reads them: {unused}; implement them, or refuse them in their "
        "schema's check() and list them in REFUSED"
    )


def _refused_cases() -> Iterator[tuple[str, str, Refusal]]:
    for master, (schema, _) in MASTERS.items():
        for dotted, owner, name, _tp in walk(schema):
            refusal = _refusal(owner, name)
            if refusal is None or master not in refusal.masters:
                continue
            yield master, dotted, refusal


@pytest.mark.parametrize(("master", "key", "refusal"), list(_refused_cases()))
def test_refused_key_fails_validation_with_one_line(master: str, key: str, refusal: Refusal) -> None:
    schema, base = MASTERS[master]
    validate_config(base, schema)
    for other, value in refusal.setup:
        base = _with(base, other, value)
    run = "evaluation" if master == "eval" else master
    line = f"{key}: {refusal.message.format(run=run)}"
    assert line not in _problems(base, schema)  # the line comes from setting `key`, not from the setup
    assert line in _problems(_with(base, key, refusal.value), schema)


def _problems(config: dict[str, Any], schema: type) -> list[str]:
    try:
        validate_config(config, schema)
    except ConfigError as error:
        return error.problems
    return []


def _with(base: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``base`` with ``dotted`` set to ``value``."""
    config = copy.deepcopy(base)
    node = config
    *parents, leaf = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return config


def test_the_walk_finds_an_unread_key(tmp_path: Path) -> None:
    """A key only validation reads is reported: the walk can fail."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text(
        "class C:\n    def check(self):\n        return self.logprob_chunk_size\n"
        "def run(config):\n    return config.policy.precision\n"
    )
    reads = code_reads(package)
    assert "precision" in reads.names and "logprob_chunk_size" not in reads.names
    assert "policy.logprob_chunk_size" in unused_keys("grpo", reads)
