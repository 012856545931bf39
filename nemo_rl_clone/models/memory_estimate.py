"""How much memory each worker of a run will hold at its peak, from the config alone (the dry run's plan).

Per policy worker (the DTensor worker keeps fp32 master weights whatever ``policy.precision``; FSDP shards weights,
gradients, Adam state and the reference copy over the worker group):

- parameters: 4 B × N (plus a 2 B × N compute copy that FSDP gathers when ``precision`` is bf16/fp16);
- gradients: 4 B × trainable; optimizer: AdamW's two fp32 moments, 8 B × trainable;
- reference: a frozen fp32 copy of the weights when the run needs reference logprobs (GRPO's KL term, DPO);
- activations: the training microbatch's tokens (``train_mb_tokens`` with packing or dynamic batching, else
  ``train_micro_batch_size × max_total_sequence_length``) × layers × `ACTIVATION_VALUES_PER_TOKEN_LAYER` values of
  the compute dtype (only the layer inputs with activation checkpointing);
- logits: one chunk of ``logprob_chunk_size`` (default 1,024) positions × vocabulary in fp32, twice (logits and
  their softmax): the head projects only the loss tokens, chunk by chunk (`token_logprob_head`), so a chunk holds
  at most the microbatch's loss tokens (GRPO: its response share, ``max_new_tokens / max_total_sequence_length``); the full
  ``[tokens, vocab]`` logits three times over with ``logits_at_loss_tokens_only: false``;
- runtime: the process itself (Python, torch, transformers, Ray's worker), `POLICY_RUNTIME_BYTES` measured.

The Megatron worker (`megatron_worker_memory`) follows Megatron's own layout: its stage's layers, tensor- and
expert-parallel shards, the distributed optimizer's share (computed from the layout; not calibrated on measured
runs as the DTensor worker is).

Per generation engine: its weights in ``vllm_cfg.precision``, its KV cache (``kv_cache_memory_bytes``, else on CPU
1 GiB and on GPU ``gpu_memory_utilization`` × the device's memory, which also holds the weights), on CPU the
refit's incoming weights (two copies), and the runtime with vLLM imported (`ENGINE_RUNTIME_BYTES`, measured). An
engine of several tensor/pipeline ranks is its actor (runtime, the refit's incoming state dict) and one process per
rank: the rank's shard of the weights (`engine_rank_parameters`), its own KV cache of that size (vLLM's sizes are
per device), on CPU the whole incoming state dict twice (as it arrives and unpacked; its loader shards it) and
`ENGINE_RANK_RUNTIME_BYTES`; engines per node = generation devices / (TP × PP). The policy worker's ``refit`` column is the state dict it hands over (`refit_bytes`).

Calibration (2-core CPU machine, resident peaks measured in real runs, see docs/preflight.md): the constants below
put the plan within 25% of the measured peak for the main job and the smoke configs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nemo_rl_clone.models.generation.engine_layout import kv_heads_per_rank, padded_vocab, stage_layers

# Values kept per token and per decoder layer for the backward, in units of the compute dtype: ~5 × hidden
# (the layer's input, its two norms' outputs, the attention output and the residual) plus ~4 × intermediate (the
# MLP's gate and up projections, the activation and their product). Calibrated on SmolLM2-135M (hidden 576,
# intermediate 1,536): benchmarks/policy_memory.py measured ~2.2 GB above the weights and Adam state for a
# 2,048-token microbatch, i.e. ~9,000 values per token and layer.
ACTIVATION_HIDDEN_FACTOR = 5
ACTIVATION_INTERMEDIATE_FACTOR = 4
# What the worker processes hold besides the model (Python, torch, transformers, Ray's worker, the tokenizer; the
# engine also vLLM with enforce_eager, its scheduler and sampler): read off the GRPO smoke run's measured peaks
# (tiny-random-llama, whose weights, state and activations are a few tens of MB) on the 2-core CPU machine,
# 2026-11-25: policy worker 0.87 GB, engine 1.23 GB peak resident.
POLICY_RUNTIME_BYTES = int(0.7e9)
ENGINE_RUNTIME_BYTES = int(1.0e9)
# A rank process of an engine of several ranks (vLLM's worker: the model runner, no scheduler): a TP = 2
# tiny-random-llama engine's ranks peaked at 0.91 GB with ~0.13 GB of weights, KV cache and refit (2026-11-29).
ENGINE_RANK_RUNTIME_BYTES = int(0.8e9)

PRECISION_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}
COLUMNS = (
    "parameters",
    "gradients",
    "optimizer",
    "reference",
    "activations",
    "logits",
    "kv_cache",
    "refit",
    "runtime",
)


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs from a model's config; the parameter count from a meta-device model (no weights)."""

    num_parameters: int
    num_layers: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    num_expert_parameters: int = 0  # of `num_parameters`, those of routed experts (MoE models)
    # What an engine's tensor-parallel ranks split (0: unknown, the layers counted as split evenly).
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    tied_embeddings: bool = False  # the head is the embedding table (counted once in `num_parameters`)
    active_expert_fraction: float = 1.0  # MoE: the share of the routed experts each token runs (top-k / experts)

    @classmethod
    def of(cls, model_path: str, overrides: Any = None) -> ModelShape:
        import torch
        from transformers import AutoModelForCausalLM

        from nemo_rl_clone.models.huggingface import load_hf_config

        config = load_hf_config(model_path, overrides)
        text = getattr(config, "text_config", None) or config
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        heads = getattr(text, "num_attention_heads", None) or 0
        head = model.get_output_embeddings()
        return cls(
            num_parameters=sum(p.numel() for p in model.parameters()),  # tied embeddings counted once
            num_expert_parameters=sum(p.numel() for name, p in model.named_parameters() if ".experts." in name),
            num_layers=text.num_hidden_layers,
            hidden_size=text.hidden_size,
            intermediate_size=getattr(text, "intermediate_size", None) or 4 * text.hidden_size,
            vocab_size=text.vocab_size,
            num_attention_heads=heads,
            num_key_value_heads=getattr(text, "num_key_value_heads", None) or heads,
            head_dim=getattr(text, "head_dim", None) or (text.hidden_size // heads if heads else 0),
            tied_embeddings=head is not None and head.weight is model.get_input_embeddings().weight,
            active_expert_fraction=_active_expert_fraction(text),
        )


def _active_expert_fraction(text_config: Any) -> float:
    experts = next(
        (
            getattr(text_config, key)
            for key in ("num_experts", "num_local_experts", "n_routed_experts")
            if getattr(text_config, key, None)
        ),
        None,
    )
    per_token = getattr(text_config, "num_experts_per_tok", None)
    return float(per_token) / float(experts) if experts and per_token else 1.0


@dataclass(frozen=True)
class WorkerMemory:
    """One kind of worker: how many there are (per node) and the bytes of one at its peak, by `COLUMNS`."""

    kind: str
    count: int
    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def policy_worker_memory(
    policy: Any,
    shape: ModelShape,
    shards: int,
    reference: bool,
    loss_share: float = 1.0,
    refit: int = 0,
    kind: str = "policy worker",
    count: int = 1,
) -> WorkerMemory:
    """Peak bytes of one DTensor policy worker training with ``policy`` (a `PolicyConfig`), its state sharded over
    ``shards`` workers; ``reference``: it keeps a frozen reference copy; ``loss_share``: the fraction of a
    microbatch's tokens the loss reads (GRPO: the responses), which the head projects; ``refit``: bytes of the
    weights it hands to the engines at once (`refit_bytes`)."""
    dtensor = policy.dtensor_cfg
    n = shape.num_parameters
    trainable = _lora_parameters(dtensor.lora_cfg, shape) if dtensor.lora_cfg.enabled else n
    compute_bytes = PRECISION_BYTES[policy.precision]
    parameters = 4 * n // shards + (2 * n // shards if compute_bytes < 4 else 0)
    tokens = min(training_microbatch_tokens(policy), _worker_batch_tokens(policy, shards))
    activations = tokens * shape.num_layers * _values_per_token_layer(shape, dtensor.activation_checkpointing)
    activations *= compute_bytes
    if dtensor.logits_at_loss_tokens_only:
        from nemo_rl_clone.models.policy.workers.token_logprob_head import DEFAULT_CHUNK_SIZE

        positions = min(int(tokens * loss_share), policy.logprob_chunk_size or DEFAULT_CHUNK_SIZE)
        logits = 2 * positions * shape.vocab_size * 4
    else:
        logits = 3 * tokens * shape.vocab_size * 4
    parts = {
        "parameters": parameters,
        "gradients": 4 * trainable // shards,
        "optimizer": 8 * trainable // shards,
        "reference": 4 * n // shards if reference and not dtensor.lora_cfg.enabled else 0,
        "activations": activations,
        "logits": logits,
        "kv_cache": 0,
        "refit": refit,
        "runtime": POLICY_RUNTIME_BYTES,
    }
    return WorkerMemory(kind, count, parts)


def megatron_worker_memory(
    policy: Any,
    shape: ModelShape,
    world: int,
    reference: bool,
    refit: int = 0,
    count: int = 1,
) -> WorkerMemory:
    """Peak bytes of one Megatron policy worker of ``world``: its pipeline stage's share of the layers, cut by tensor
    parallelism, and for an MoE model its share of the experts (expert parallelism × expert tensor parallelism).
    Megatron keeps the model in the compute dtype and a gradient buffer (fp32 with ``grad_reduce_in_fp32``); the
    optimizer holds fp32 master weights (mixed precision) and Adam's two moments, sharded over the data-parallel
    ranks by the distributed optimizer (over the expert-data-parallel ranks for experts). Activations as for the
    DTensor worker over the stage's layers (cut by tensor parallelism under sequence parallelism, and by context
    parallelism: each cp rank runs 1/cp of every packed sample); the full fp32 logits (no selective head), cut by
    tensor parallelism but not by cp (the losses read them gathered over the cp ranks). The distributed optimizer's
    data-parallel ranks include the cp ranks, as Megatron's do."""
    mcfg = policy.megatron_cfg
    tp, pp = mcfg.tensor_model_parallel_size, mcfg.pipeline_model_parallel_size
    moe = shape.num_expert_parameters > 0
    ep, etp = (mcfg.expert_model_parallel_size, mcfg.expert_tensor_parallel_size) if moe else (1, 1)
    dense = (shape.num_parameters - shape.num_expert_parameters) // (tp * pp)
    experts = shape.num_expert_parameters // (ep * etp * pp)
    local = dense + experts
    compute_bytes = PRECISION_BYTES[policy.precision]
    state_bytes = 8 + (4 if compute_bytes < 4 else 0)  # Adam moments, and fp32 master weights in mixed precision
    if mcfg.optimizer.use_distributed_optimizer:
        optimizer = state_bytes * (dense // max(world // (tp * pp), 1) + experts // max(world // (ep * etp * pp), 1))
    else:
        optimizer = state_bytes * local
    grad_bytes = 4 if mcfg.distributed_data_parallel_config.grad_reduce_in_fp32 else compute_bytes
    tokens = training_microbatch_tokens(policy)
    per_layer = _values_per_token_layer(shape, mcfg.activation_checkpointing)
    # Sequence parallelism splits the activations outside attention and MLP too; without it they are counted whole.
    activation_share = (tp if mcfg.sequence_parallel else 1) * mcfg.context_parallel_size
    parts = {
        "parameters": compute_bytes * local,
        "gradients": grad_bytes * local,
        "optimizer": optimizer,
        "reference": compute_bytes * local if reference else 0,
        "activations": tokens * (shape.num_layers // pp) * per_layer * compute_bytes // activation_share,
        "logits": 3 * tokens * shape.vocab_size // tp * 4,
        "kv_cache": 0,
        "refit": refit,
        "runtime": POLICY_RUNTIME_BYTES,
    }
    return WorkerMemory("policy worker", count, parts)


def inference_worker_memory(kind: str, precision: str, shape: ModelShape, shards: int, count: int) -> WorkerMemory:
    """A frozen model that only scores (distillation's teacher): weights, no training state."""
    parts = dict.fromkeys(COLUMNS, 0)
    parts["parameters"] = 4 * shape.num_parameters // shards
    parts["runtime"] = POLICY_RUNTIME_BYTES
    del precision  # the worker keeps fp32 weights and casts for compute, as the policy does
    return WorkerMemory(kind, count, parts)


def engine_memory(vllm_cfg: Any, shape: ModelShape, device_bytes: int | None, count: int) -> WorkerMemory:
    """One rank of a vLLM engine (``vllm_cfg``: a `VllmConfig`), the whole engine when it has one rank;
    ``device_bytes``: its GPU's memory, None on CPU; ``count``: such workers per node."""
    single = vllm_cfg.devices_per_engine == 1
    weights = PRECISION_BYTES.get(vllm_cfg.precision, 2) * engine_rank_parameters(vllm_cfg, shape)  # fp8: bf16 kept
    full = PRECISION_BYTES.get(vllm_cfg.precision, 2) * shape.num_parameters
    parts = dict.fromkeys(COLUMNS, 0)
    parts["parameters"] = weights
    parts["kv_cache"] = engine_kv_cache_bytes(vllm_cfg, weights, device_bytes)
    if single:  # the async engine loads vLLM twice: in the engine actor and in its engine core process
        parts["runtime"] = ENGINE_RUNTIME_BYTES * (2 if vllm_cfg.async_engine else 1)
    else:
        parts["runtime"] = ENGINE_RANK_RUNTIME_BYTES
    # Single: the incoming state dict mapped from Ray's object store and its checked copy. A rank: the whole state
    # dict as it arrives from the actor and unpacked (its loader shards it).
    parts["refit"] = 2 * full if device_bytes is None else 0
    return WorkerMemory("generation engine" if single else "engine rank", count, parts)


def engine_workers(vllm_cfg: Any, shape: ModelShape, device_bytes: int | None, engines: int) -> list[WorkerMemory]:
    """What the ``engines`` engines of a node hold. An engine of several ranks (vLLM's multi-process executor) is
    its Ray actor (the scheduler; on CPU a refit's incoming state dict, which it passes on to the ranks) and one
    process per tensor/pipeline rank (`engine_memory`)."""
    if vllm_cfg.devices_per_engine == 1:
        return [engine_memory(vllm_cfg, shape, device_bytes, engines)]
    parts = dict.fromkeys(COLUMNS, 0)
    parts["runtime"] = ENGINE_RUNTIME_BYTES * (2 if vllm_cfg.async_engine else 1)
    if device_bytes is None:
        parts["refit"] = PRECISION_BYTES.get(vllm_cfg.precision, 2) * shape.num_parameters
    ranks = engine_memory(vllm_cfg, shape, device_bytes, engines * vllm_cfg.devices_per_engine)
    return [WorkerMemory("generation engine", engines, parts), ranks]


def engine_rank_parameters(vllm_cfg: Any, shape: ModelShape) -> int:
    """Parameters the largest rank of an engine holds: its pipeline stage's layers, each cut over the
    tensor-parallel ranks (K and V projections by whole KV heads, copied when ranks outnumber them; experts spread
    over the ranks alike), and the vocabulary-parallel tables (padded to a multiple of 64): embedding on the first
    stage, head on the last, one table when they are tied and one stage holds both. Norms counted as split."""
    tp, pp = vllm_cfg.tensor_parallel_size, vllm_cfg.pipeline_parallel_size
    tables = 1 if shape.tied_embeddings else 2
    table = shape.vocab_size * shape.hidden_size
    layers = shape.num_parameters - tables * table
    kv = 2 * shape.num_layers * shape.num_key_value_heads * shape.head_dim * shape.hidden_size
    kv_rank = kv // shape.num_key_value_heads * kv_heads_per_rank(shape.num_key_value_heads, tp) if kv else 0
    stage = ((layers - kv) // tp + kv_rank) * stage_layers(shape.num_layers, pp) // shape.num_layers
    table_rank = -(-padded_vocab(shape.vocab_size) // tp) * shape.hidden_size
    return stage + table_rank * (tables if pp == 1 else 1)


def engine_kv_cache_bytes(vllm_cfg: Any, rank_weights: int, device_bytes: int | None) -> int:
    """KV cache of one engine rank: ``kv_cache_memory_bytes`` (vLLM's per-device size, the CPU default when unset),
    or on GPU without it ``gpu_memory_utilization`` of the device less the rank's weights."""
    if vllm_cfg.kv_cache_memory_bytes is not None:
        return int(vllm_cfg.kv_cache_memory_bytes)
    if device_bytes is None:
        return _default_cpu_kv_cache()
    return max(int(vllm_cfg.gpu_memory_utilization * device_bytes) - rank_weights, 0)


def engine_kv_cache_tokens(vllm_cfg: Any, shape: ModelShape, kv_cache_bytes: int) -> int:
    """Tokens an engine's KV cache holds: each rank keeps K and V of its stage's layers and its KV heads, so a rank's
    ``kv_cache_bytes`` hold the same tokens for every rank. 0 when the model's heads are unknown."""
    if not shape.num_key_value_heads:
        return 0
    kv_bytes = 1 if vllm_cfg.kv_cache_dtype.startswith("fp8") else PRECISION_BYTES.get(vllm_cfg.precision, 2)
    heads = kv_heads_per_rank(shape.num_key_value_heads, vllm_cfg.tensor_parallel_size)
    layers = stage_layers(shape.num_layers, vllm_cfg.pipeline_parallel_size)
    return kv_cache_bytes // (2 * layers * heads * shape.head_dim * kv_bytes)


def refit_bytes(vllm_cfg: Any, shape: ModelShape, colocated: bool, on_gpu: bool) -> int:
    """Host memory a policy worker holds for one refit: colocated, train rank 0 gathers the whole state dict in the
    engine's precision and puts it into Ray's object store (two copies in its process); non-colocated, it
    broadcasts size-bounded buckets. On GPU both live outside the device's memory."""
    if on_gpu:
        return 0
    if colocated:
        return 2 * PRECISION_BYTES.get(vllm_cfg.precision, 2) * shape.num_parameters
    from nemo_rl_clone.distributed.weight_transfer import DEFAULT_BUCKET_BYTES

    return 2 * int(DEFAULT_BUCKET_BYTES)


def training_microbatch_tokens(policy: Any) -> int:
    """Tokens of the largest training microbatch ``policy`` allows."""
    for section in (policy.sequence_packing, policy.dynamic_batching):
        if section.enabled and section.train_mb_tokens:
            return int(section.train_mb_tokens)
    return int(policy.train_micro_batch_size * policy.max_total_sequence_length)


def _worker_batch_tokens(policy: Any, shards: int) -> int:
    """A microbatch holds at most this worker's share of the global batch, each sample at most the length limit."""
    return max(policy.train_global_batch_size // shards, 1) * policy.max_total_sequence_length


def _values_per_token_layer(shape: ModelShape, activation_checkpointing: bool) -> int:
    """Activation values a decoder layer keeps per token for the backward (see the factors above)."""
    if activation_checkpointing:
        return shape.hidden_size  # only each layer's input survives until the backward
    return ACTIVATION_HIDDEN_FACTOR * shape.hidden_size + ACTIVATION_INTERMEDIATE_FACTOR * shape.intermediate_size


def _lora_parameters(lora_cfg: Any, shape: ModelShape) -> int:
    # Adapters of rank r on every linear layer of a decoder: q, k, v, o (hidden × hidden) and the MLP's three
    # (hidden × intermediate); each adapter is r × (in + out).
    hidden, inner = shape.hidden_size, shape.intermediate_size
    per_layer = lora_cfg.dim * (4 * 2 * hidden + 3 * (hidden + inner))
    return per_layer * shape.num_layers


def _default_cpu_kv_cache() -> int:
    from nemo_rl_clone.models.generation.vllm.engine_io import DEFAULT_CPU_KV_CACHE_BYTES

    return int(DEFAULT_CPU_KV_CACHE_BYTES)
