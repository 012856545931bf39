"""Build one rank's Megatron Core GPT model, DDP wrapper, optimizer and LR scheduler from a Hugging Face model.

The model uses Megatron's local (non-Transformer-Engine) layer spec with RMSNorm, SwiGLU and RoPE, so it needs no
Transformer Engine and runs on CPU (over gloo, with `megatron_cpu_shims`) as well as on GPU. Master weights are fp32;
with bf16/fp16 the model runs in `Float16Module` and the optimizer keeps fp32 main parameters.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, cast

import megatron_cpu_shims
import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core import parallel_state, tensor_parallel
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.models.gpt import GPTModel
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnBackend
from megatron.core.transformer.module import Float16Module
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_block import (
    TransformerBlock,
    TransformerBlockSubmodules,
    get_num_layers_to_build,
)
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from nemo_rl_clone.distributed.worker_placement import collective_timeout
from nemo_rl_clone.models.policy.megatron import converter, lora, moe
from nemo_rl_clone.models.policy.megatron import value_head as value_heads
from nemo_rl_clone.models.policy.megatron.packing import PackedCoreAttention
from nemo_rl_clone.utils.errors import UserInputError

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclasses.dataclass
class Parallelism:
    tensor: int
    pipeline: int
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    expert: int = 1  # expert-parallel ranks (MoE models)
    expert_tensor: int | None = None  # each expert's tensor-parallel ranks; None: Megatron's default (= tensor)
    sequence: bool = False  # sequence parallelism (with tensor > 1): norms and dropouts see 1/tensor of the tokens
    context: int = 1  # context-parallel ranks (packed rows only): each holds 1/context of every sample


def init_model_parallel(parallelism: Parallelism, seed: int = 1234) -> None:
    """Megatron's process groups over the already initialised default group (rank order: tp fastest, then cp,
    dp, pp), with the CPU shims installed first when there is no GPU."""
    megatron_cpu_shims.apply()
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=parallelism.tensor,
            pipeline_model_parallel_size=parallelism.pipeline,
            context_parallel_size=parallelism.context,
            expert_model_parallel_size=parallelism.expert,
            expert_tensor_parallel_size=parallelism.expert_tensor,
            **_timeout_minutes(),
        )
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def _timeout_minutes() -> dict[str, float]:
    """Megatron's groups get the cluster's collective timeout (they set their own, 30 min, otherwise)."""
    timeout = collective_timeout()
    return {} if timeout is None else {"distributed_timeout_minutes": timeout.total_seconds() / 60}


def check_runtime_support(mcfg: Any) -> None:
    """Options that need CUDA: refused on a CPU-only machine with the key to change."""
    if torch.cuda.is_available():
        return
    ddp = mcfg.distributed_data_parallel_config
    for key in ("overlap_grad_reduce", "overlap_param_gather"):
        if getattr(ddp, key):
            raise UserInputError(
                f"policy.megatron_cfg.distributed_data_parallel_config.{key}: overlapping needs CUDA streams; set it "
                "to false on a CPU-only machine"
            )


def compute_dtype(mcfg: Any, precision: str) -> torch.dtype:
    """The model's compute dtype: ``policy.precision``, which ``pipeline_dtype`` and the optimizer's ``bf16``/``fp16``
    follow when null and must agree with when set (validation checks it)."""
    opt = mcfg.optimizer
    if opt.bf16:
        return torch.bfloat16
    if opt.fp16:
        return torch.float16
    return _DTYPES[mcfg.pipeline_dtype or precision]


def scaled_rope(hf_config: Any) -> tuple[torch.Tensor, float] | None:
    """Hugging Face's inverse frequencies and attention factor of a scaled RoPE (``linear``, ``llama3``, ``yarn``;
    None for plain RoPE): computed by transformers itself, so the trainer rotates exactly as the HF model and the
    engine do. YaRN's factor multiplies cos and sin for queries and keys alike, i.e. the attention logits by its
    square: Megatron gets it as the softmax scale."""
    rope_type = converter.rope_scaling_type(hf_config)
    if rope_type == "default":
        return None
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[rope_type](hf_config, torch.device("cpu"))
    return inv_freq.float(), float(attention_factor)


def transformer_config(
    shape: converter.ModelShape, hf_config: Any, mcfg: Any, precision: str, parallelism: Parallelism
) -> TransformerConfig:
    dtype = compute_dtype(mcfg, precision)
    scaled = scaled_rope(hf_config)
    softmax_scale = scaled[1] ** 2 / math.sqrt(shape.head_dim) if scaled and scaled[1] != 1.0 else None
    recompute: dict[str, Any] = {}
    if mcfg.activation_checkpointing:
        granularity = mcfg.recompute_granularity
        recompute = {"recompute_granularity": granularity}
        if granularity == "full":
            recompute |= {"recompute_method": "uniform", "recompute_num_layers": 1}
        elif mcfg.recompute_modules:
            recompute["recompute_modules"] = list(mcfg.recompute_modules)
    return TransformerConfig(
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_attention_heads,
        num_query_groups=shape.num_query_groups,
        kv_channels=shape.head_dim,
        ffn_hidden_size=shape.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=float(getattr(hf_config, "rms_norm_eps", 1e-6)),
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=shape.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=parallelism.tensor,
        sequence_parallel=parallelism.sequence and parallelism.tensor > 1,
        pipeline_model_parallel_size=parallelism.pipeline,
        context_parallel_size=parallelism.context,
        num_layers_in_first_pipeline_stage=parallelism.first_stage_layers,
        num_layers_in_last_pipeline_stage=parallelism.last_stage_layers,
        pipeline_dtype=dtype,
        params_dtype=_DTYPES[mcfg.optimizer.params_dtype],
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        use_cpu_initialization=not torch.cuda.is_available(),
        # Initialisation also marks the tensor-parallel parameters (without it, grad norms count shards as duplicates).
        perform_initialization=True,
        bias_activation_fusion=mcfg.bias_activation_fusion,
        attention_backend=AttnBackend[mcfg.attention_backend],  # the local spec's attention for every accepted value
        softmax_scale=softmax_scale,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        # Microbatches (dynamic batching) differ in length: pipeline stages exchange shapes (variable_seq_lengths);
        # also the MoE settings (`moe.transformer_kwargs`).
        **moe.transformer_kwargs(shape, mcfg),
        **recompute,
    )


class RMSNorm(torch.nn.RMSNorm):
    """torch's RMSNorm built as Megatron builds norms. Megatron's own wrapper of it (the local spec's norm) refuses
    sequence parallelism; under it each tensor-parallel rank normalises its share of the tokens, so the weight is
    marked ``sequence_parallel`` and Megatron's ``finalize_model_grads`` sums its gradient over those ranks."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **_unused: Any) -> None:
        super().__init__(hidden_size, eps=eps)
        self.weight.sequence_parallel = config.sequence_parallel  # type: ignore[attr-defined]


def _decoder_spec(config: TransformerConfig, shape: converter.ModelShape) -> ModuleSpec:
    """The local layer spec (`moe.layer_spec`) with every norm, the final one included, a `RMSNorm`, and the core
    attention `PackedCoreAttention` (packed rows, context parallelism)."""
    swaps = {WrappedTorchNorm: RMSNorm, DotProductAttention: PackedCoreAttention}

    def swap(value: Any) -> Any:
        if isinstance(value, type) and value in swaps:
            return swaps[value]
        if isinstance(value, ModuleSpec):
            return dataclasses.replace(value, module=swap(value.module), submodules=swap(value.submodules))
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            changes = {field.name: swap(getattr(value, field.name)) for field in dataclasses.fields(value)}
            return dataclasses.replace(value, **changes)
        return value

    layer = swap(moe.layer_spec(shape))
    layers = [layer] * get_num_layers_to_build(config)
    return ModuleSpec(module=TransformerBlock, submodules=TransformerBlockSubmodules(layers, layer_norm=RMSNorm))


def build_model(
    config: TransformerConfig,
    shape: converter.ModelShape,
    hf_config: Any,
    hf_state: dict[str, torch.Tensor],
    value_head: bool = False,
) -> tuple[GPTModel, range]:
    """This rank's GPT model (its pipeline stage, its tensor-parallel shards) holding the Hugging Face weights;
    also the global layer numbers of the stage. ``value_head``: a sequence-classification model's scalar ``score``
    head in place of the vocabulary projection (`value_head.ValueHead`)."""
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    pp_size = parallel_state.get_pipeline_model_parallel_world_size()
    pre_process, post_process = pp_rank == 0, pp_rank == pp_size - 1
    layers = converter.stage_layers(
        shape.num_layers,
        pp_size,
        pp_rank,
        config.num_layers_in_first_pipeline_stage,
        config.num_layers_in_last_pipeline_stage,
    )
    with megatron_cpu_shims.cuda_redirect():  # tied embeddings over pipeline stages call `.cuda()`
        model = GPTModel(
            config,
            transformer_layer_spec=_decoder_spec(config, shape),
            vocab_size=shape.vocab_size,
            max_sequence_length=int(getattr(hf_config, "max_position_embeddings", 4096)),
            pre_process=pre_process,
            post_process=post_process,
            parallel_output=True,  # logits stay split over the vocab: the losses compute vocab-parallel logprobs
            share_embeddings_and_output_weights=shape.tied_embeddings and not value_head,
            position_embedding_type="rope",
            rotary_base=converter.rope_theta(hf_config),
        )
    if value_head and post_process:
        value_heads.install(model, config)
    scaled = scaled_rope(hf_config)
    if scaled is not None:  # before the first forward: Megatron caches the angles it computes from inv_freq
        model.rotary_pos_emb.inv_freq = scaled[0].to(model.rotary_pos_emb.inv_freq.device)
    if len(model.decoder.layers) != len(layers):
        raise RuntimeError(f"Megatron built {len(model.decoder.layers)} layers for this stage, expected {len(layers)}")
    local = converter.shard_for_rank(
        converter.hf_to_megatron(hf_state, shape),
        parallel_state.get_tensor_model_parallel_rank(),
        parallel_state.get_tensor_model_parallel_world_size(),
        layers,
        pre_process,
        post_process,
        _expert_shard(shape),
    )
    if shape.tied_embeddings and post_process and not pre_process and not value_head:
        # The last stage holds its own copy of the tied embedding as the output layer.
        local["output_layer.weight"] = converter.shard_for_rank(
            {"output_layer.weight": hf_state["model.embed_tokens.weight"]},
            parallel_state.get_tensor_model_parallel_rank(),
            parallel_state.get_tensor_model_parallel_world_size(),
            layers,
            True,
            True,
        )["output_layer.weight"]
    missing, unexpected = model.load_state_dict(local, strict=False)
    missing = [name for name in missing if not name.endswith("_extra_state")]
    if missing or unexpected:
        raise RuntimeError(f"Hugging Face → Megatron conversion: missing {missing}, unexpected {unexpected}")
    if torch.cuda.is_available():
        model.cuda(torch.cuda.current_device())
    return model, layers


def wrap_model(model: GPTModel, config: TransformerConfig, mcfg: Any) -> DistributedDataParallel:
    """Float16Module (bf16/fp16) and Megatron's DDP (its grad buffers feed the distributed optimizer)."""
    ddp = mcfg.distributed_data_parallel_config
    module: torch.nn.Module = Float16Module(config, model) if (config.bf16 or config.fp16) else model
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=ddp.grad_reduce_in_fp32,
        overlap_grad_reduce=ddp.overlap_grad_reduce,
        overlap_param_gather=ddp.overlap_param_gather,
        average_in_collective=False,  # sum, then scale (gloo has no ReduceOp.AVG)
        use_distributed_optimizer=mcfg.optimizer.use_distributed_optimizer,
    )
    with megatron_cpu_shims.cuda_redirect():
        return DistributedDataParallel(config, ddp_config, module)


def build_optimizer(model: DistributedDataParallel, config: TransformerConfig, mcfg: Any) -> Any:
    opt = mcfg.optimizer
    optimizer_config = OptimizerConfig(
        optimizer=opt.optimizer,
        lr=opt.lr,
        min_lr=opt.min_lr,
        weight_decay=opt.weight_decay,
        adam_beta1=opt.adam_beta1,
        adam_beta2=opt.adam_beta2,
        adam_eps=opt.adam_eps,
        sgd_momentum=opt.sgd_momentum,
        use_distributed_optimizer=opt.use_distributed_optimizer,
        clip_grad=opt.clip_grad if opt.clip_grad is not None else 0.0,
        bf16=config.bf16,
        fp16=config.fp16,
        params_dtype=config.params_dtype,
    )
    with megatron_cpu_shims.cuda_redirect():
        optimizer = get_megatron_optimizer(optimizer_config, [model])
    config.grad_scale_func = optimizer.scale_loss  # fp16 loss scaling (a no-op scale of 1 otherwise)
    return optimizer


def build_scheduler(optimizer: Any, mcfg: Any) -> OptimizerParamScheduler:
    """Megatron's LR / weight-decay schedule, stepped once per `train` call (NeMo-RL's convention). As in Megatron,
    the LR decays over ``lr_decay_iters`` (null: ``train_iters``) and the weight decay ramps over ``train_iters``."""
    sched, opt = mcfg.scheduler, mcfg.optimizer
    decay_iters = sched.lr_decay_iters or mcfg.train_iters
    if sched.lr_decay_style == "constant":  # the LR never decays: any length past the warm-up will do
        decay_iters = max(decay_iters or 0, sched.lr_warmup_iters + 1)
    elif decay_iters is None or decay_iters <= sched.lr_warmup_iters:
        raise UserInputError(
            f"policy.megatron_cfg.scheduler: lr_decay_style {sched.lr_decay_style!r} decays over lr_decay_iters, or "
            f"train_iters when that is null ({decay_iters}), which must be more than lr_warmup_iters="
            f"{sched.lr_warmup_iters}"
        )
    return OptimizerParamScheduler(
        optimizer,
        init_lr=sched.lr_warmup_init,
        max_lr=opt.lr,
        min_lr=opt.min_lr,
        lr_warmup_steps=sched.lr_warmup_iters,
        lr_decay_steps=decay_iters,
        lr_decay_style=sched.lr_decay_style,
        start_wd=sched.start_weight_decay,
        end_wd=sched.end_weight_decay,
        wd_incr_steps=mcfg.train_iters or decay_iters,
        wd_incr_style=sched.weight_decay_incr_style,
        override_opt_param_scheduler=sched.override_opt_param_scheduler,
        use_checkpoint_opt_param_scheduler=not sched.override_opt_param_scheduler,
    )


def unwrap(model: torch.nn.Module) -> GPTModel:
    """The GPTModel inside DDP / Float16Module."""
    while not isinstance(model, GPTModel):
        model = cast(torch.nn.Module, model.module)
    return model


def _expert_shard(shape: converter.ModelShape) -> converter.ExpertShard:
    if not shape.is_moe:
        return converter.ExpertShard()
    return converter.ExpertShard.of_rank(
        shape,
        parallel_state.get_expert_model_parallel_rank(),
        parallel_state.get_expert_model_parallel_world_size(),
        parallel_state.get_expert_tensor_parallel_rank(),
        parallel_state.get_expert_tensor_parallel_world_size(),
    )


def gather_hf_state_dict(model: torch.nn.Module, shape: converter.ModelShape, layers: range) -> dict | None:
    """The full Hugging Face state dict (CPU, the model's dtype, transformers' in-memory layout) on global rank 0,
    None elsewhere. A collective: each stage's tensor-parallel shards are gathered in the TP group (experts' in the
    expert-TP group), then every stage's first data-parallel, first tensor-parallel rank sends its share to rank 0
    (for experts: each expert-parallel rank's first expert-data-parallel, first expert-TP rank sends its experts)."""
    groups = {
        False: (
            parallel_state.get_tensor_model_parallel_group(),
            parallel_state.get_tensor_model_parallel_world_size(),
        ),
        True: (
            parallel_state.get_expert_tensor_parallel_group(),
            parallel_state.get_expert_tensor_parallel_world_size(),
        ),
    }
    sends = {
        False: parallel_state.get_tensor_model_parallel_rank() == 0
        and parallel_state.get_data_parallel_rank() == 0
        and parallel_state.get_context_parallel_rank() == 0,
        True: parallel_state.get_expert_tensor_parallel_rank() == 0
        and parallel_state.get_expert_data_parallel_rank() == 0,
    }
    expert_offset = _expert_shard(shape).offset
    stage: dict[str, torch.Tensor] = {}
    gpt = unwrap(model)
    value_head = value_heads.is_value_head(gpt)
    merged = lora.merged_weights(gpt)  # LoRA: the engines and exports get W + scaling · B @ A
    for name, tensor in gpt.state_dict().items():
        if name.endswith("_extra_state") or tensor is None or lora.is_adapter_key(name):
            continue
        tensor = merged.get(name, tensor)
        if value_head and name == "output_layer.weight":
            name = converter.SCORE_MEGATRON  # whole on every rank
        tensor, expert = tensor.detach(), converter.is_expert(name)
        group, size = groups[expert]
        if size > 1 and converter.partition_dim(name) is not None:
            shards = [torch.empty_like(tensor) for _ in range(size)]
            dist.all_gather(shards, tensor.contiguous(), group=group)
            tensor = converter.merge_tensor_parallel(name, shards)
        if sends[expert]:
            # A copy: DDP's parameters are views into one flat buffer, which pickling would send whole per tensor.
            stage[converter.to_global_name(name, layers, expert_offset)] = tensor.to("cpu", copy=True)
    if dist.get_world_size() == 1:
        return converter.megatron_to_hf(stage, shape)
    shares: list[Any] = [None] * dist.get_world_size() if dist.get_rank() == 0 else []
    dist.gather_object(stage or None, shares if dist.get_rank() == 0 else None, dst=0)
    if dist.get_rank() != 0:
        return None
    full: dict[str, torch.Tensor] = {}
    for share in shares:
        full.update(share or {})
    return converter.megatron_to_hf(full, shape)
