"""``policy.megatron_cfg``: the Megatron Core backend's keys, with NeMo-RL's names and defaults.

Each key is one of three kinds (the table in docs/policy.md#choosing-a-backend lists them all):

- implemented: read by the Megatron policy worker;
- refused when set to anything but its default: a feature this backend does not have. Most need Transformer
  Engine: the backend builds Megatron's local (non-TE) layer spec on every machine, so that CPU and GPU runs
  compute the same model;
- MoE keys (router, dispatcher, expert parallelism): read for MoE models (Qwen3-MoE), where the worker refuses at
  start-up, by name, the values it cannot run (`moe.check`: it needs the model, which validation does not load);
  inert on dense models (Llama, Qwen2, Qwen3), where NeMo-RL's recipes set them and NeMo-RL ignores them too;
- inert: the sub-keys of refused features (``fp8_cfg.*``, ``peft.*``).

The section is checked only when ``enabled`` is true: NeMo-RL's DTensor recipes carry a ``megatron_cfg`` block
(TE fusions switched on) that nothing reads, and they must keep validating.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from nemo_rl_clone.utils.config_validation import SectionReads, check_at_least

# The HF architectures the converter maps to Megatron (``converter_type``; null: the model's ``architectures[0]``).
CONVERTER_TYPES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
ATTENTION_BACKENDS = ("auto", "local", "unfused")
_TE_ATTENTION_BACKENDS = ("flash", "fused")
# Megatron's selective-recompute modules that exist in a dense (non-MoE, non-MLA) model.
DENSE_RECOMPUTE_MODULES = ("core_attn", "layernorm", "mlp")
_MOE_OR_MLA_RECOMPUTE_MODULES = ("moe", "moe_act", "shared_experts", "mla_up_proj")
_SWIGLU_ONLY = "the converter builds SwiGLU models only (Llama, Qwen2, Qwen3, Qwen3-MoE)"

_LOCAL_SPEC = "needs Transformer Engine, and this backend builds Megatron's local (non-TE) layer spec"


@dataclass
class MegatronOptimizerConfig(SectionReads):
    """Megatron's optimizer: Adam with decoupled weight decay (AdamW) or SGD, over fp32 master weights."""

    optimizer: Literal["adam", "sgd"] = "adam"  # adam: AdamW (decoupled weight decay); sgd: with momentum
    lr: float = 5e-6  # the peak learning rate: the scheduler warms up to it, then lr_decay_style moves it to min_lr
    min_lr: float = 5e-7  # the floor of the decaying lr_decay_styles
    weight_decay: float = 0.01  # the scheduler's start/end_weight_decay set each step's decay (Megatron's rule)
    bf16: bool | None = None  # null: follow policy.precision; set, it must agree with it
    fp16: bool | None = None  # as bf16, for float16
    params_dtype: str = "float32"  # the model's parameters: float32, or the half compute dtype (main weights stay fp32)
    adam_beta1: float = 0.9  # Adam's first-moment decay, in [0, 1)
    adam_beta2: float = 0.999  # Adam's second-moment decay, in [0, 1)
    adam_eps: float = 1e-8  # added to Adam's denominator
    sgd_momentum: float = 0.9  # optimizer: sgd only
    use_distributed_optimizer: bool = True  # optimizer state sharded over data-parallel ranks
    # TE's FusedAdam with master weights/moments in chosen dtypes; at the default fp32 dtypes the same update as
    # Megatron's distributed Adam, which runs instead here (no TE): accepted, noted in the log (`local_spec_notes`).
    use_precision_aware_optimizer: bool = False
    # The Megatron backend clips here (policy.max_grad_norm is the DTensor backend's; a different value is logged as
    # unused, as NeMo-RL's Megatron worker ignores it too); null or 0: no clipping.
    clip_grad: float | None = 1.0
    optimizer_cpu_offload: bool = False  # refused
    optimizer_offload_fraction: float = 0.0  # refused


@dataclass
class MegatronSchedulerConfig(SectionReads):
    """Megatron's ``OptimizerParamScheduler``: linear warm-up from ``lr_warmup_init`` to ``optimizer.lr`` over
    ``lr_warmup_iters`` steps, then ``lr_decay_style`` down to ``optimizer.min_lr`` at ``lr_decay_iters``; the
    weight decay goes from ``start_weight_decay`` to ``end_weight_decay`` by ``weight_decay_incr_style``."""

    start_weight_decay: float = 0.01
    end_weight_decay: float = 0.01
    weight_decay_incr_style: Literal["constant", "linear", "cosine"] = "constant"
    lr_decay_style: Literal["constant", "linear", "cosine", "inverse-square-root", "WSD"] = "constant"
    lr_decay_iters: int | None = 1000  # null: train_iters (Megatron's rule)
    lr_warmup_iters: int = 13
    lr_warmup_init: float = 5e-7
    # On resume: false keeps the checkpoint's schedule (a notice names what the config would change); true takes
    # the config's values and keeps only the checkpoint's step count (Megatron's flag of that name).
    override_opt_param_scheduler: bool = False


@dataclass
class MegatronDDPConfig(SectionReads):
    """Megatron DDP (``DistributedDataParallelConfig``). The two overlaps need CUDA streams: the worker refuses
    them at start-up on a machine without CUDA."""

    grad_reduce_in_fp32: bool = False  # gradients kept and reduced over DP ranks in fp32 (else the compute dtype)
    overlap_grad_reduce: bool = False  # the gradient reduce overlaps the backward pass (CUDA only)
    overlap_param_gather: bool = False  # the distributed optimizer's all-gather overlaps the forward (CUDA only)
    use_custom_fsdp: bool = False  # refused
    data_parallel_sharding_strategy: str = "optim_grads_params"  # custom FSDP's only: the default alone


@dataclass
class MegatronFP8Config(SectionReads):
    """Refused through ``enabled``; the other keys configure FP8 training and do nothing while it is off."""

    enabled: bool = False
    fp8: str = "e4m3"  # inert: the FP8 format
    fp8_recipe: str = "blockwise"  # inert: the FP8 scaling recipe
    fp8_param: bool = False  # inert: parameters kept in FP8


@dataclass
class MegatronPeftConfig(SectionReads):
    """LoRA on the decoder's linear layers (`megatron.lora`); the other keys do nothing while it is off."""

    enabled: bool = False  # train LoRA adapters only, the base weights frozen
    target_modules: list[str] = field(default_factory=list)  # layer name patterns; empty: every decoder linear layer
    exclude_modules: list[str] = field(default_factory=list)  # patterns of targeted layers to leave out
    dim: int = 8  # the adapters' rank
    alpha: int = 32  # the update is scaled by alpha / dim
    dropout: float = 0.0  # in [0, 1); > 0 refused with tensor_model_parallel_size > 1
    dropout_position: str = "post"  # "pre": dropout on the adapter's input; "post": on its update
    lora_A_init_method: str = "xavier"  # only "xavier"
    lora_B_init_method: str = "zero"  # only "zero": the run starts as the base model
    a2a_experimental: bool = False  # all-to-all LoRA of MoE experts: refused
    lora_dtype: str | None = None  # NeMo-RL's recipes write the string "None"


@dataclass
class MegatronConfig(SectionReads):
    """NeMo-RL's ``policy.megatron_cfg``. ``enabled: true`` (with ``dtensor_cfg.enabled: false``) trains the
    policy with Megatron Core: TP × PP × DP, Megatron DDP and distributed optimizer, HF weights converted in memory
    at start-up."""

    enabled: bool = False  # true: train with Megatron Core (dtensor_cfg.enabled must be false)
    # The HF → Megatron conversion always runs in memory at start-up (there is no converted-weights cache), so
    # every start is a fresh conversion whatever this says.
    force_reconvert_from_hf: bool = False
    # Optimizer steps the schedule spans, as Megatron reads it: the weight-decay ramp's length, and the LR decay's
    # when scheduler.lr_decay_iters is null. null: the run's step count, which the algorithms fill in (as NeMo-RL's).
    train_iters: int | None = None
    env_vars: dict[str, str] | None = field(default_factory=dict)  # set in each worker; null: none
    empty_unused_memory_level: int = 1  # 0, 1 or 2: how often the worker empties the CUDA cache (NeMo-RL's levels)
    activation_checkpointing: bool = False  # recompute activations in the backward pass (recompute_granularity)
    recompute_granularity: Literal["full", "selective"] = "full"  # full: whole layers; selective: recompute_modules
    recompute_modules: list[str] | None = None  # selective only; null: Megatron's ["core_attn"]
    converter_type: str | None = None  # null: the model's config.json architectures[0]
    tensor_model_parallel_size: int = 1  # TP: each layer's weights split over this many ranks
    pipeline_model_parallel_size: int = 1  # PP: the layers split into this many stages
    num_layers_in_first_pipeline_stage: int | None = None  # null: layers split evenly over the stages
    num_layers_in_last_pipeline_stage: int | None = None  # null: layers split evenly over the stages
    context_parallel_size: int = 1  # each sample split over this many ranks; needs policy.sequence_packing
    # MoE models: each expert's MLP split over this many ranks (Megatron keeps it apart from the attention's TP).
    expert_tensor_parallel_size: int = 1
    expert_model_parallel_size: int = 1  # MoE models: the experts spread over this many ranks
    pipeline_dtype: Literal["float32", "bfloat16", "float16"] | None = None  # null: policy.precision
    # With tensor_model_parallel_size > 1: norms and residuals hold 1/TP of the tokens (Megatron needs it for MoE).
    sequence_parallel: bool = False
    attention_backend: str = "auto"  # auto, local or unfused (the local spec's attention); flash/fused refused (TE)
    apply_rope_fusion: bool = (
        False  # a fused-kernel speed option: RoPE runs unfused in the local spec (`local_spec_notes`)
    )
    bias_activation_fusion: bool = True  # Megatron's fused SwiGLU in the MLPs
    gradient_accumulation_fusion: bool = False  # refused
    defer_fp32_logits: bool = False  # half precision: the model returns logits in its dtype, not cast to fp32
    use_fused_weighted_squared_relu: bool = False  # refused
    use_linear_ce_fusion_loss: bool = False  # training computes token logprobs from hidden states (`linear_ce`)
    linear_ce_fusion_chunk_size: int | None = None  # positions per chunk of that; null: NeMo-RL's 256
    mtp_num_layers: int = 0  # multi-token prediction: refused when set
    mtp_loss_scaling_factor: float = 0.0  # MTP only: refused when set
    mtp_use_repeated_layer: bool = False  # MTP only: refused when set
    mtp_detach_heads: bool = False  # MTP only: refused when set
    # MoE keys: read for MoE models (`moe.py` says which values run), inert on dense ones. NeMo-RL's defaults;
    # null: Megatron's own.
    freeze_moe_router: bool = True  # the routers keep their initial weights
    moe_aux_loss_coeff: float = 0.0  # the load-balancing loss's weight (moe_router_load_balancing_type)
    moe_router_dtype: str | None = "fp64"  # the router's softmax and top-k: fp32, fp64 or null
    moe_router_load_balancing_type: str = "none"  # none, aux_loss, seq_aux_loss or global_aux_loss
    moe_router_bias_update_rate: float = 0.0  # passed to Megatron; acts only with the (refused) expert bias
    moe_router_enable_expert_bias: bool | None = None  # aux-loss-free expert bias: refused (softmax routers)
    moe_token_dispatcher_type: str = "alltoall"  # alltoall (needs CUDA) or allgather
    moe_permute_fusion: bool = True  # accepted, logged: tokens are permuted unfused (no TE)
    moe_grouped_gemm: bool | None = None  # refused: experts run one by one (SequentialMLP)
    moe_enable_deepep: bool = False  # DeepEP token dispatch: refused
    moe_shared_expert_overlap: bool = False  # refused: Qwen3-MoE has no shared experts
    moe_per_layer_logging: bool = False  # per-layer MoE metrics: refused
    moe_flex_dispatcher_backend: str | None = None  # the flex dispatcher (DeepEP/HybridEP): refused
    moe_hybridep_num_sms: int | None = None  # inert: the refused HybridEP backend's SMs
    peft: MegatronPeftConfig = field(default_factory=MegatronPeftConfig)
    fp8_cfg: MegatronFP8Config = field(default_factory=MegatronFP8Config)
    optimizer: MegatronOptimizerConfig = field(default_factory=MegatronOptimizerConfig)
    scheduler: MegatronSchedulerConfig = field(default_factory=MegatronSchedulerConfig)
    distributed_data_parallel_config: MegatronDDPConfig = field(default_factory=MegatronDDPConfig)


_NOT_YET = "in the Megatron backend"
_NO_MTP = "only applies to multi-token prediction"
_NO_OFFLOAD = f"optimizer CPU offload {_NOT_YET}"
_DDP = "distributed_data_parallel_config"

# (section path relative to megatron_cfg ("" for itself), field) → why a non-default value is refused.
_REFUSED_UNLESS_DEFAULT: dict[tuple[str, str], str] = {
    ("", "gradient_accumulation_fusion"): (
        "needs Apex's fused_weight_gradient_mlp_cuda kernel, which the linear layers of Megatron's local (non-TE) "
        "layer spec that this backend builds would call; it is not installed"
    ),
    ("", "use_fused_weighted_squared_relu"): f"is for squared-ReLU MLPs, and {_SWIGLU_ONLY}",
    ("", "mtp_num_layers"): f"multi-token prediction {_NOT_YET}",
    ("", "mtp_loss_scaling_factor"): _NO_MTP,
    ("", "mtp_use_repeated_layer"): _NO_MTP,
    ("", "mtp_detach_heads"): _NO_MTP,
    ("fp8_cfg", "enabled"): f"FP8 training {_LOCAL_SPEC}",
    ("optimizer", "optimizer_cpu_offload"): _NO_OFFLOAD,
    ("optimizer", "optimizer_offload_fraction"): _NO_OFFLOAD,
    (_DDP, "use_custom_fsdp"): (
        "Megatron's custom FSDP; this backend uses Megatron DDP with the distributed optimizer"
    ),
    (_DDP, "data_parallel_sharding_strategy"): "only applies to Megatron's custom FSDP",
}


def _check_peft(cfg: MegatronConfig) -> list[tuple[str, str]]:
    peft = cfg.peft
    if not peft.enabled:
        return []
    problems = [(f"peft.{key}", message) for key, message in check_at_least(peft, 1, "dim")]
    if not 0.0 <= peft.dropout < 1.0:
        problems.append(("peft.dropout", f"must be in [0, 1), got {peft.dropout}"))
    if peft.dropout_position not in ("pre", "post"):
        problems.append(("peft.dropout_position", f"must be 'pre' or 'post', got {peft.dropout_position!r}"))
    refused = {
        "dropout": cfg.tensor_model_parallel_size > 1
        and peft.dropout > 0
        and "adapter dropout with tensor_model_parallel_size > 1 (each rank would drop other entries)",
        "lora_A_init_method": peft.lora_A_init_method != "xavier"
        and f"lora_A_init_method {peft.lora_A_init_method!r} (xavier only)",
        "lora_B_init_method": peft.lora_B_init_method != "zero"
        and f"lora_B_init_method {peft.lora_B_init_method!r} (zero only: the run starts as the base model)",
        "a2a_experimental": peft.a2a_experimental and "all-to-all LoRA of MoE experts",
        "lora_dtype": peft.lora_dtype not in (None, "None") and "adapters in a dtype of their own (null: the model's)",
    }
    problems += [(f"peft.{key}", f"not supported yet: {why}") for key, why in refused.items() if why]
    return problems


def local_spec_notes(cfg: MegatronConfig) -> list[str]:
    """Accepted speed options the local (non-TE) layer spec has no kernel for, one log line each: the run computes
    the same result without them (NeMo-RL's recipes turn them on by default)."""
    notes = []
    if cfg.apply_rope_fusion:
        notes.append(
            "policy.megatron_cfg.apply_rope_fusion: no fused RoPE kernel without Transformer Engine; RoPE runs unfused"
        )
    if cfg.optimizer.use_precision_aware_optimizer:
        notes.append(
            "policy.megatron_cfg.optimizer.use_precision_aware_optimizer: TE's FusedAdam is not installed; Megatron's "
            "distributed Adam keeps fp32 master weights and moments (the precision-aware optimizer's default dtypes)"
        )
    return notes


def check_megatron_config(cfg: MegatronConfig) -> list[tuple[str, str]]:
    """Problems of an enabled ``megatron_cfg`` on its own, keys relative to it (`PolicyConfig.check` adds the ones
    that involve other policy keys)."""
    problems = check_at_least(
        cfg,
        1,
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "context_parallel_size",
        "expert_model_parallel_size",
        "expert_tensor_parallel_size",
    )
    problems += _check_refused(cfg)
    problems += _check_peft(cfg)
    for name in ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"):
        layers = getattr(cfg, name)
        if layers is not None and cfg.pipeline_model_parallel_size <= 1:
            problems.append((name, "only applies with pipeline_model_parallel_size > 1; set it to null"))
        elif layers is not None and layers < 1:
            problems.append((name, f"must be >= 1, got {layers}"))
    if cfg.empty_unused_memory_level not in (0, 1, 2):
        problems.append(("empty_unused_memory_level", f"must be 0, 1 or 2, got {cfg.empty_unused_memory_level}"))
    if cfg.converter_type is not None and cfg.converter_type not in CONVERTER_TYPES:
        problems.append(
            (
                "converter_type",
                f"not supported yet: {cfg.converter_type!r}; the converter builds {list(CONVERTER_TYPES)} (or null: "
                "the model's architectures[0])",
            )
        )
    if cfg.attention_backend in _TE_ATTENTION_BACKENDS:
        problems.append(
            (
                "attention_backend",
                f"not supported yet: {cfg.attention_backend!r} {_LOCAL_SPEC}; use one of {list(ATTENTION_BACKENDS)}",
            )
        )
    elif cfg.attention_backend not in ATTENTION_BACKENDS:
        problems.append(
            ("attention_backend", f"must be one of {list(ATTENTION_BACKENDS)}, got {cfg.attention_backend!r}")
        )
    if cfg.linear_ce_fusion_chunk_size is not None and cfg.linear_ce_fusion_chunk_size < 1:
        problems.append(("linear_ce_fusion_chunk_size", f"must be >= 1, got {cfg.linear_ce_fusion_chunk_size}"))
    if cfg.use_linear_ce_fusion_loss and cfg.context_parallel_size > 1:
        problems.append(
            (
                "use_linear_ce_fusion_loss",
                "not supported with context_parallel_size > 1 (as in NeMo-RL); set it to false",
            )
        )
    problems += _check_recompute(cfg)
    problems += _check_optimizer_and_scheduler(cfg)
    ddp = cfg.distributed_data_parallel_config
    if ddp.overlap_param_gather and not cfg.optimizer.use_distributed_optimizer:
        problems.append(
            (
                "distributed_data_parallel_config.overlap_param_gather",
                "only applies with optimizer.use_distributed_optimizer: true; set it to false",
            )
        )
    return problems


def _check_refused(cfg: MegatronConfig) -> list[tuple[str, str]]:
    problems = []
    for (section, name), reason in _REFUSED_UNLESS_DEFAULT.items():
        owner: Any = getattr(cfg, section) if section else cfg
        default = next(f.default for f in dataclasses.fields(owner) if f.name == name)
        value = getattr(owner, name)
        if value != default:
            shown = str(default).lower() if isinstance(default, bool) else repr(default)
            got = "" if isinstance(default, bool) else f" (got {value!r})"
            key = f"{section}.{name}" if section else name
            problems.append((key, f"not supported yet: {reason}; set it to {shown}{got}"))
    return problems


def _check_recompute(cfg: MegatronConfig) -> list[tuple[str, str]]:
    problems = []
    selective = cfg.activation_checkpointing and cfg.recompute_granularity == "selective"
    if cfg.recompute_granularity == "selective" and not cfg.activation_checkpointing:
        problems.append(("recompute_granularity", "only applies with activation_checkpointing: true"))
    if cfg.recompute_modules is not None and not selective:
        problems.append(
            (
                "recompute_modules",
                "only applies with activation_checkpointing: true and recompute_granularity: selective; set it to null",
            )
        )
    for module in (cfg.recompute_modules or []) if selective else []:
        if module in _MOE_OR_MLA_RECOMPUTE_MODULES:
            problems.append(
                (
                    "recompute_modules",
                    f"not supported yet: {module!r} (MoE or MLA modules); MoE models recompute with "
                    "recompute_granularity: full",
                )
            )
        elif module not in DENSE_RECOMPUTE_MODULES:
            problems.append(("recompute_modules", f"must be from {list(DENSE_RECOMPUTE_MODULES)}, got {module!r}"))
    return problems


def _check_optimizer_and_scheduler(cfg: MegatronConfig) -> list[tuple[str, str]]:
    """Megatron's own asserts (``OptimizerParamScheduler``), reported at validation instead of at start-up."""
    return _check_optimizer(cfg.optimizer) + _check_scheduler(cfg.scheduler, cfg.optimizer.lr, cfg.train_iters)


def _check_optimizer(opt: MegatronOptimizerConfig) -> list[tuple[str, str]]:
    problems = []
    if opt.optimizer == "sgd" and opt.use_distributed_optimizer:
        problems.append(
            (
                "optimizer.use_distributed_optimizer",
                "Megatron's distributed optimizer shards Adam only; set it to false for optimizer: sgd",
            )
        )
    for name in ("adam_beta1", "adam_beta2"):
        beta = getattr(opt, name)
        if not 0 <= beta < 1:
            problems.append((f"optimizer.{name}", f"must be in [0, 1), got {beta}"))
    for name in ("weight_decay", "adam_eps", "sgd_momentum"):
        if getattr(opt, name) < 0:
            problems.append((f"optimizer.{name}", f"must be >= 0, got {getattr(opt, name)}"))
    if not 0 <= opt.min_lr <= opt.lr:
        problems.append(("optimizer.min_lr", f"must be between 0 and optimizer.lr ({opt.lr}), got {opt.min_lr}"))
    return problems


def _check_scheduler(sched: MegatronSchedulerConfig, lr: float, train_iters: int | None) -> list[tuple[str, str]]:
    problems = []
    if train_iters is not None and train_iters < 1:
        problems.append(("train_iters", f"must be >= 1 (or null: the run's step count), got {train_iters}"))
    if not 0 <= sched.lr_warmup_init <= lr:
        problems.append(
            ("scheduler.lr_warmup_init", f"must be between 0 and optimizer.lr ({lr}), got {sched.lr_warmup_init}")
        )
    if sched.lr_warmup_iters < 0:
        problems.append(("scheduler.lr_warmup_iters", f"must be >= 0, got {sched.lr_warmup_iters}"))
    if sched.lr_decay_style == "WSD":
        problems.append(
            (
                "scheduler.lr_decay_style",
                "'WSD' needs a WSD decay length and style, which this config has no keys for yet; use 'constant', "
                "'linear', 'cosine' or 'inverse-square-root'",
            )
        )
    if sched.lr_decay_iters is not None and sched.lr_decay_iters <= max(sched.lr_warmup_iters, 0):
        problems.append(
            (
                "scheduler.lr_decay_iters",
                f"must be > lr_warmup_iters ({sched.lr_warmup_iters}), got {sched.lr_decay_iters}",
            )
        )
    # As in Megatron, the scheduler sets every step's weight decay (from the first step on), so
    # optimizer.weight_decay does not act when it differs; NeMo-RL's recipes rely on that (a value model's
    # optimizer.weight_decay overridden while its schedule keeps the base value).
    if sched.weight_decay_incr_style == "constant" and sched.end_weight_decay != sched.start_weight_decay:
        problems.append(
            (
                "scheduler.end_weight_decay",
                f"must equal start_weight_decay ({sched.start_weight_decay}) with weight_decay_incr_style "
                f"'constant', got {sched.end_weight_decay}",
            )
        )
    elif sched.end_weight_decay < sched.start_weight_decay:
        problems.append(
            (
                "scheduler.end_weight_decay",
                f"must be >= start_weight_decay ({sched.start_weight_decay}): Megatron's weight-decay schedule only "
                f"increases; got {sched.end_weight_decay}",
            )
        )
    if sched.start_weight_decay < 0:
        problems.append(("scheduler.start_weight_decay", f"must be >= 0, got {sched.start_weight_decay}"))
    return problems


def check_megatron_against_policy(
    cfg: MegatronConfig, precision: str, max_grad_norm: float | None
) -> list[tuple[str, str]]:
    """The keys of an enabled ``megatron_cfg`` that repeat a policy key must agree with it (keys relative to
    ``megatron_cfg``): one setting, one meaning."""
    problems = []
    if cfg.pipeline_dtype is not None and cfg.pipeline_dtype != precision:
        problems.append(
            (
                "pipeline_dtype",
                f"must equal policy.precision ({precision}) or be null (follow it), got {cfg.pipeline_dtype}",
            )
        )
    # Half-precision parameters are what Megatron's Float16Module makes of fp32 ones anyway, with fp32 main weights in
    # the optimizer; without a half compute dtype they would be trained directly, with no fp32 copy.
    if cfg.optimizer.params_dtype not in ("float32", precision):
        problems.append(
            (
                "optimizer.params_dtype",
                f"not supported yet: {cfg.optimizer.params_dtype} parameters with policy.precision={precision} "
                "(training them without fp32 main weights); set 'float32' or the precision",
            )
        )
    for name, dtype in (("bf16", "bfloat16"), ("fp16", "float16")):
        value = getattr(cfg.optimizer, name)
        if value is not None and value != (precision == dtype):
            problems.append(
                (
                    f"optimizer.{name}",
                    f"must be {str(precision == dtype).lower()} with policy.precision={precision} (or null: follow "
                    f"it), got {str(value).lower()}",
                )
            )
    return problems
