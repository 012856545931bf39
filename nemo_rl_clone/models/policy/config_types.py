"""NeMo-RL v0.7.0's TypedDicts of the ``policy`` section (``nemo_rl.models.policy``), presented by the package
`nemo_rl_clone.models.policy`: the dict shapes NeMo-RL's scripts build and read by key.

They only type dicts: the section is validated as this library's `nemo_rl_clone.models.policy.config.PolicyConfig`
where it is used, which names each unknown or refused key in one line. Kept free of torch and Ray; not ``from
__future__ import annotations``: a TypedDict reads ``NotRequired`` from evaluated annotations.
"""

from typing import Any, Literal, NotRequired, TypedDict

from nemo_rl_clone.models.generation.config_types import GenerationConfig


class LoRAConfigDisabled(TypedDict):
    enabled: Literal[False]


class LoRAConfig(TypedDict):
    enabled: Literal[True]
    target_modules: list[str]
    exclude_modules: list[str]
    match_all_linear: NotRequired[bool]
    dim: int
    alpha: int
    dropout: float
    dropout_position: Literal["pre", "post"]
    lora_A_init: str
    use_triton: NotRequired[bool]


class DTensorConfigDisabled(TypedDict):
    enabled: Literal[False]


class MoEParallelizerOptions(TypedDict):
    ignore_router_for_ac: NotRequired[bool]
    reshard_after_forward: NotRequired[bool]
    lm_head_precision: NotRequired[str | None]
    wrap_outer_model: NotRequired[bool]


class DTensorConfig(TypedDict):
    enabled: Literal[True]
    env_vars: NotRequired[dict[str, str] | None]
    _v2: NotRequired[bool]
    tensor_parallel_size: int
    context_parallel_size: int
    expert_parallel_size: NotRequired[int]
    dp_replicate_size: NotRequired[int]
    sequence_parallel: bool
    activation_checkpointing: bool
    cpu_offload: bool
    custom_parallel_plan: NotRequired[str | None]
    defer_fsdp_grad_sync: NotRequired[bool]
    moe_parallelizer: NotRequired[MoEParallelizerOptions]
    lora_cfg: NotRequired[LoRAConfig | LoRAConfigDisabled]
    automodel_kwargs: NotRequired[dict[str, Any]]  # NeMo Automodel's options: dtensor/automodel_options.py
    clear_cache_every_n_steps: NotRequired[int | None]


class SequencePackingConfigDisabled(TypedDict):
    enabled: Literal[False]


class SequencePackingConfig(TypedDict):
    enabled: Literal[True]
    train_mb_tokens: int
    logprob_mb_tokens: NotRequired[int]  # absent where no logprobs are computed (SFT)
    algorithm: str


class RewardModelConfig(TypedDict):
    enabled: bool
    reward_model_type: str


class MegatronPeftConfigDisabled(TypedDict):
    enabled: Literal[False]


class MegatronPeftConfig(TypedDict):
    enabled: Literal[True]
    target_modules: list[str]
    exclude_modules: list[str]
    dim: int
    alpha: int
    dropout: float
    dropout_position: Literal["pre", "post"]
    lora_A_init_method: str
    lora_B_init_method: str
    a2a_experimental: bool
    lora_dtype: str | None


class MegatronOptimizerConfig(TypedDict):
    optimizer: str
    lr: float
    min_lr: float
    weight_decay: float
    bf16: bool
    fp16: bool
    params_dtype: str
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    sgd_momentum: float
    use_distributed_optimizer: bool
    use_precision_aware_optimizer: bool
    clip_grad: float
    optimizer_cpu_offload: bool
    optimizer_offload_fraction: float


class MegatronSchedulerConfig(TypedDict):
    start_weight_decay: float
    end_weight_decay: float
    weight_decay_incr_style: str
    lr_decay_style: str
    lr_decay_iters: NotRequired[int | None]
    lr_warmup_iters: int
    lr_warmup_init: float


class MegatronDDPConfig(TypedDict):
    grad_reduce_in_fp32: bool
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    use_custom_fsdp: bool
    data_parallel_sharding_strategy: str


class Fp8Config(TypedDict):
    """FP8 training of the Megatron backend: only ``enabled: false`` is accepted here."""

    enabled: bool
    fp8: NotRequired[str]
    fp8_recipe: NotRequired[str]
    fp8_param: NotRequired[bool]
    force_clear_fp8_caches: NotRequired[bool]


class MegatronConfigDisabled(TypedDict):
    enabled: Literal[False]


class MegatronConfig(TypedDict):
    enabled: Literal[True]
    env_vars: NotRequired[dict[str, str] | None]
    empty_unused_memory_level: int
    activation_checkpointing: bool
    recompute_granularity: NotRequired[Literal["full", "selective"]]
    recompute_modules: NotRequired[list[str] | None]
    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    num_layers_in_first_pipeline_stage: int | None
    num_layers_in_last_pipeline_stage: int | None
    context_parallel_size: int
    pipeline_dtype: str
    sequence_parallel: bool
    freeze_moe_router: bool
    expert_tensor_parallel_size: int
    expert_model_parallel_size: int
    defer_fp32_logits: NotRequired[bool]
    apply_rope_fusion: bool
    bias_activation_fusion: bool
    force_reconvert_from_hf: NotRequired[bool]
    attention_backend: NotRequired[str]
    moe_per_layer_logging: bool
    moe_enable_deepep: bool
    moe_token_dispatcher_type: str
    inference_moe_token_dispatcher_type: NotRequired[str]
    inference_grouped_gemm_backend: NotRequired[str]
    moe_router_num_groups: NotRequired[int | None]
    moe_router_group_topk: NotRequired[int | None]
    transformer_impl: NotRequired[str]
    cuda_graph_impl: NotRequired[str]
    moe_pad_experts_for_cuda_graph_inference: NotRequired[bool]
    moe_shared_expert_overlap: bool
    moe_grouped_gemm: NotRequired[bool]
    moe_flex_dispatcher_backend: NotRequired[str]
    moe_hybridep_num_sms: NotRequired[int]
    hybridep_num_ranks_per_nvlink_domain: NotRequired[int]
    hybridep_use_mnnvl: NotRequired[bool]
    peft: NotRequired[MegatronPeftConfig | MegatronPeftConfigDisabled]
    optimizer: MegatronOptimizerConfig
    scheduler: MegatronSchedulerConfig
    distributed_data_parallel_config: MegatronDDPConfig
    gradient_accumulation_fusion: NotRequired[bool]
    use_fused_weighted_squared_relu: NotRequired[bool]
    use_linear_ce_fusion_loss: NotRequired[bool]
    linear_ce_fusion_chunk_size: NotRequired[int]
    mtp_num_layers: NotRequired[int]
    mtp_loss_scaling_factor: NotRequired[float]
    mtp_use_repeated_layer: NotRequired[bool]
    mtp_detach_heads: NotRequired[bool]
    clear_memory_caches_before_refit: NotRequired[bool]
    fp8_cfg: NotRequired[Fp8Config]


class DraftConfigDisabled(TypedDict):
    """An EAGLE draft model trained beside the policy is not built here: only this disabled shape is accepted."""

    enabled: Literal[False]


class TokenizerConfig(TypedDict):
    name: str
    chat_template: NotRequired[str]
    chat_template_kwargs: NotRequired[dict[str, Any] | None]  # passed to tokenizer.apply_chat_template
    audio: NotRequired[dict[str, Any]]
    video: NotRequired[dict[str, Any]]
    use_processor: NotRequired[bool]


class PytorchOptimizerConfig(TypedDict):
    name: str
    kwargs: dict[str, Any]


class SinglePytorchSchedulerConfig(TypedDict):
    name: str
    kwargs: dict[str, Any]


class SinglePytorchMilestonesConfig(TypedDict):
    milestones: list[int]  # SequentialLR's switch points


SchedulerMilestones = dict[str, list[int]]


class DynamicBatchingConfigDisabled(TypedDict):
    enabled: Literal[False]


class DynamicBatchingConfig(TypedDict):
    enabled: Literal[True]
    train_mb_tokens: int
    logprob_mb_tokens: NotRequired[int]
    sequence_length_round: int


class RouterReplayConfigDisabled(TypedDict):
    enabled: Literal[False]


class RouterReplayConfig(TypedDict):
    enabled: Literal[True]


class PolicyConfig(TypedDict):
    model_name: str
    tokenizer: TokenizerConfig
    train_global_batch_size: int
    train_micro_batch_size: int
    logprob_batch_size: NotRequired[int]
    logprob_chunk_size: NotRequired[int | None]
    generation: NotRequired[GenerationConfig]
    generation_batch_size: NotRequired[int]
    precision: str
    reward_model_cfg: NotRequired[RewardModelConfig]
    dtensor_cfg: DTensorConfig | DTensorConfigDisabled
    megatron_cfg: NotRequired[MegatronConfig | MegatronConfigDisabled]
    draft: NotRequired[DraftConfigDisabled]
    pretrained_checkpoint: NotRequired[dict[str, Any]]  # initial Megatron weights: refused where validated
    router_replay: NotRequired[RouterReplayConfig | RouterReplayConfigDisabled]
    hf_config_overrides: NotRequired[dict[str, Any]]
    dynamic_batching: DynamicBatchingConfig | DynamicBatchingConfigDisabled
    sequence_packing: NotRequired[SequencePackingConfig | SequencePackingConfigDisabled]
    make_sequence_length_divisible_by: int
    max_total_sequence_length: int
    max_grad_norm: NotRequired[float | int | None]
    refit_buffer_size_gb: NotRequired[float]
    optimizer: NotRequired[PytorchOptimizerConfig | None]
    scheduler: NotRequired[
        list[SinglePytorchSchedulerConfig | SinglePytorchMilestonesConfig] | SchedulerMilestones | None
    ]
    quant_cfg: NotRequired[str | None]
    quant_calib_data: NotRequired[str | None]
    quant_calib_size: NotRequired[int | None]
    quant_batch_size: NotRequired[int | None]
    quant_sequence_length: NotRequired[int | None]
    disable_modelopt_layer_spec: NotRequired[bool]
