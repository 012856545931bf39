"""Policy config (``policy``): NeMo-RL's keys, typed, with the checks NeMo-RL leaves to runtime crashes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from nemo_rl_clone.models.generation.config import GenerationConfig
from nemo_rl_clone.models.policy.backend_checks import check_backend, feature_problems, hf_overrides_refused
from nemo_rl_clone.models.policy.backends import backend_spec, known_backend_spec, parallel_layout
from nemo_rl_clone.models.policy.dtensor import automodel_options
from nemo_rl_clone.models.policy.megatron.config import MegatronConfig
from nemo_rl_clone.utils.config_validation import SectionReads, check_at_least

# apply_chat_template's own arguments: the code sets them per call, a config must not pin them.
_RESERVED_TEMPLATE_KWARGS = ("messages", "add_generation_prompt", "continue_final_message", "tools", "documents")


@dataclass
class TokenizerConfig(SectionReads):
    """``name`` null: the model's tokenizer. ``chat_template`` (NeMo-RL's meanings): ``"default"`` (or left out)
    the tokenizer's own template; null the pass-through template (contents concatenated, no markup); a ``.jinja``
    path, that file; another string, the template itself. ``chat_template_kwargs``: variables every chat-template
    rendering sees (e.g. ``{enable_thinking: false}``), see `nemo_rl_clone.models.huggingface.configure_chat_template`."""

    name: str | None = None  # null → policy.model_name
    chat_template: str | None = "default"
    chat_template_kwargs: dict[str, Any] | None = None

    def check(self) -> list[tuple[str, str]]:
        problems = []
        for key in self.chat_template_kwargs or {}:
            if not key.isidentifier() or key in _RESERVED_TEMPLATE_KWARGS:
                problems.append(
                    (
                        f"chat_template_kwargs.{key}",
                        "must be a template variable name (an identifier), not one of apply_chat_template's own "
                        f"arguments {list(_RESERVED_TEMPLATE_KWARGS)}",
                    )
                )
        return problems

    def load(self, model_name: str) -> Any:
        """The tokenizer of ``name`` (null: ``model_name``) with this section's chat template settings applied."""
        from nemo_rl_clone.models.huggingface import configure_chat_template, load_tokenizer

        tokenizer = load_tokenizer(self.name or model_name)
        return configure_chat_template(tokenizer, self.chat_template, self.chat_template_kwargs)


@dataclass
class OptimizerConfig(SectionReads):
    """A torch optimizer by class path, built as ``cls(params, **kwargs)``."""

    name: str = "torch.optim.AdamW"  # the optimizer class's import path
    # Its constructor's keyword arguments (lr, weight_decay, betas, eps, ...); lists become what the class expects.
    kwargs: dict[str, Any] = field(
        default_factory=lambda: {"lr": 5e-6, "weight_decay": 0.01, "betas": [0.9, 0.999], "eps": 1e-8}
    )


def _default_scheduler() -> list[dict[str, Any]]:
    return [
        {
            "name": "torch.optim.lr_scheduler.LinearLR",
            "kwargs": {"start_factor": 0.1, "end_factor": 1.0, "total_iters": 50},
        },
        {"name": "torch.optim.lr_scheduler.ConstantLR", "kwargs": {"factor": 1.0, "total_iters": 10000000000}},
        {"milestones": [50]},
    ]


def check_scheduler_entries(entries: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """NeMo-RL's scheduler list: ``{name, kwargs}`` entries chained by one optional ``{milestones: [...]}`` entry."""
    problems = []
    schedulers = [e for e in entries if "milestones" not in e]
    for i, entry in enumerate(entries):
        if "milestones" in entry:
            if set(entry) != {"milestones"} or not isinstance(entry["milestones"], list):
                problems.append((f"scheduler[{i}]", "a milestones entry must be exactly {milestones: [int, ...]}"))
            elif len(entry["milestones"]) != len(schedulers) - 1:
                problems.append(
                    (
                        f"scheduler[{i}].milestones",
                        f"needs {len(schedulers) - 1} values for {len(schedulers)} schedulers",
                    )
                )
        elif "name" not in entry or not set(entry) <= {"name", "kwargs"}:
            problems.append(
                (f"scheduler[{i}]", f"expected {{name, kwargs}} or {{milestones}}, got keys {sorted(entry)}")
            )
    if len(schedulers) > 1 and not any("milestones" in e for e in entries):
        problems.append(("scheduler", "several schedulers need a {milestones: [...]} entry to chain them"))
    return problems


@dataclass
class LoraConfig(SectionReads):
    """``policy.dtensor_cfg.lora_cfg``: LoRA adapters (peft) on linear layers; only the adapters train and are
    checkpointed, and the engines receive merged weights (see `nemo_rl_clone.models.policy.dtensor.lora`)."""

    enabled: bool = False  # true: train LoRA adapters only (the base weights stay frozen)
    # Which linear layers get an adapter: all but the output head (match_all_linear), or those matching
    # target_modules (a plain name matches the last parts of a module name, e.g. "q_proj"; wildcards the full name).
    match_all_linear: bool = True
    target_modules: list[str] = field(default_factory=list)  # with match_all_linear false: the layers to adapt
    exclude_modules: list[str] = field(default_factory=list)  # same matching; removed from the targets
    dim: int = 8  # the rank r
    alpha: int = 32  # the update is scaled by alpha / dim
    dropout: float = 0.0  # dropout probability on the adapter, in [0, 1)
    dropout_position: Literal["pre", "post"] = "post"  # on the adapter's input or output; "post" needs dropout 0
    lora_A_init: Literal["xavier", "kaiming"] = "xavier"  # lora_B starts at zero either way
    # NeMo-RL's fused Triton kernel for the same computation; accepted at any value, peft's PyTorch layers run.
    use_triton: bool = True

    @property
    def scaling(self) -> float:
        return self.alpha / self.dim

    def check(self) -> list[tuple[str, str]]:
        if not self.enabled:
            return []
        problems = check_at_least(self, 1, "dim")
        if not 0.0 <= self.dropout < 1.0:
            problems.append(("dropout", f"must be in [0, 1), got {self.dropout}"))
        elif self.dropout > 0 and self.dropout_position == "post":
            problems.append(
                (
                    "dropout_position",
                    "dropout on the adapter's output ('post') is not supported (peft drops the adapter's input); set "
                    "dropout_position=pre or dropout=0.0",
                )
            )
        if self.match_all_linear and self.target_modules:
            problems.append(
                (
                    "target_modules",
                    "match_all_linear=true already targets every linear layer; set match_all_linear=false to adapt "
                    "only target_modules",
                )
            )
        if not self.match_all_linear and not self.target_modules and not self.exclude_modules:
            problems.append(
                (
                    "target_modules",
                    "name the layers to adapt (e.g. [q_proj, v_proj]), or the ones to leave out (exclude_modules), "
                    "or set match_all_linear=true",
                )
            )
        return problems


@dataclass
class DTensorConfig(SectionReads):
    enabled: bool = True  # the DTensor (FSDP2) backend; false with megatron_cfg.enabled true
    # FSDP2 keeps sharded parameters, gradients and optimizer state in CPU memory (a no-op on CPU-only machines).
    cpu_offload: bool = False
    sequence_parallel: bool = False  # with tensor_parallel_size > 1: norms hold 1/TP of the tokens (Megatron's SP)
    activation_checkpointing: bool = False  # recompute each layer's activations in the backward pass
    tensor_parallel_size: int = 1  # each layer's weights split over this many ranks (the model's TP plan)
    context_parallel_size: int = 1  # each sequence split over this many ranks (ring attention)
    # Import path of a TP plan dict (module pattern → ParallelStyle) or a callable (model) -> dict; null: the model's.
    custom_parallel_plan: str | None = None
    # Project onto the vocabulary only where a loss reads a logprob (`token_mask`) or, for logprobs, where a row
    # has tokens, chunked (``policy.logprob_chunk_size``); false: full [B, S, V] logits (also the TP > 1 path).
    logits_at_loss_tokens_only: bool = True
    # Hugging Face's attention kernel. On CPU in bf16, "eager" (batched matmuls) trained 1.14x faster than "sdpa"
    # (whose CPU flash-attention backward is slow in bf16); in fp32 the two are equal.
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    # With policy.precision float32: the dtype of the backward pass's matmuls (the forward, logprobs, master weights
    # and optimizer stay fp32). "auto": bfloat16 where the hardware runs it natively (CUDA; CPUs with avx512_bf16
    # or amx_bf16), else float32. Ignored when the whole policy already computes in bf16/fp16.
    backward_precision: Literal["float32", "bfloat16", "auto"] = "float32"
    lora_cfg: LoraConfig = field(default_factory=LoraConfig)
    # Set in every DTensor policy worker's environment before the model loads (e.g. PYTORCH_CUDA_ALLOC_CONF).
    env_vars: dict[str, str] | None = None
    # Release the CUDA caching allocator's unused blocks after every n-th train step (null: never). On CPU there is
    # no such cache, so it does nothing there.
    clear_cache_every_n_steps: int | None = None
    # NeMo-RL's switch between its two DTensor workers; this library has one, so either value runs it.
    _v2: bool = True
    # NeMo Automodel's model-building options: those that name what this path does are honoured (force_hf: true,
    # attn_implementation, freeze_config, backend fields naming torch/HF kernels), the rest refused
    # (dtensor/automodel_options.py).
    automodel_kwargs: dict[str, Any] = field(default_factory=dict)
    # HSDP: the data-parallel ranks form this many groups, each sharding one whole copy (FSDP2 over a 2-D mesh:
    # sharded within a group, gradients all-reduced across groups); 1 is plain FSDP2.
    dp_replicate_size: int = 1
    # MoE experts split over this many data-parallel ranks (dtensor/expert_parallel.py); the policy worker checks
    # that it divides the model's experts and the data-parallel size.
    expert_parallel_size: int = 1

    @property
    def hf_attention(self) -> str:
        """The attention kernel the model loads with (Automodel's ``attn_implementation`` where given)."""
        return automodel_options.hf_attention(self.automodel_kwargs, self.attn_implementation)

    def check(self) -> list[tuple[str, str]]:
        if not self.enabled:  # NeMo-RL's Megatron recipes carry a disabled dtensor_cfg block that nothing reads
            return []
        problems = [(f"automodel_kwargs.{key}", why) for key, why in automodel_options.check(self.automodel_kwargs)]
        configured = self.automodel_kwargs.get("attn_implementation")
        if configured and self.attn_implementation != "sdpa" and configured != self.attn_implementation:
            problems.append(
                (
                    "automodel_kwargs.attn_implementation",
                    f"{configured!r} disagrees with dtensor_cfg.attn_implementation {self.attn_implementation!r}; "
                    "set one of them",
                )
            )
        problems += check_at_least(self, 1, "expert_parallel_size", "dp_replicate_size")
        if self.dp_replicate_size > 1 and (self.context_parallel_size > 1 or self.expert_parallel_size > 1):
            problems.append(
                (
                    "dp_replicate_size",
                    "not supported yet with context_parallel_size or expert_parallel_size > 1 (HSDP shards over the "
                    "plain data-parallel ranks); set it to 1",
                )
            )
        if self.clear_cache_every_n_steps is not None and self.clear_cache_every_n_steps < 1:
            problems.append(
                ("clear_cache_every_n_steps", f"must be >= 1 or null (never), got {self.clear_cache_every_n_steps}")
            )
        return problems


@dataclass
class DynamicBatchingConfig(SectionReads):
    """Token-budgeted microbatches of length-sorted samples (less padding)."""

    enabled: bool = False  # instead of fixed-size microbatches (train_micro_batch_size, logprob_batch_size)
    train_mb_tokens: int | None = None  # token budget of a training microbatch (padded length × rows)
    logprob_mb_tokens: int | None = None  # null: train_mb_tokens (NeMo-RL's SFT recipes leave it unset)
    sequence_length_round: int = 64  # a microbatch is padded to its longest sample rounded up to a multiple of this

    def check(self) -> list[tuple[str, str]]:
        if self.enabled and self.train_mb_tokens is None:
            return [("enabled", "dynamic batching needs train_mb_tokens (and logprob_mb_tokens, else the same)")]
        return []


PACKERS = ("modified_first_fit_decreasing", "first_fit_decreasing")


@dataclass
class SequencePackingConfig(SectionReads):
    """Bin-pack samples into microbatches of at most ``*_mb_tokens`` tokens, each run as one row without padding
    (DTensor backend, see `nemo_rl_clone.models.policy.workers.packed_sequences`)."""

    enabled: bool = False  # instead of padded microbatches; not with dynamic_batching
    train_mb_tokens: int | None = None  # tokens per packed training microbatch (at least one longest sample)
    logprob_mb_tokens: int | None = None  # null: train_mb_tokens (NeMo-RL's SFT recipes leave it unset)
    # Checked only when enabled (NeMo-RL reads it only then): its two other packers are not built here.
    algorithm: str = "modified_first_fit_decreasing"
    # Each sample's cost in the bin-packing plan, rounded up to a multiple of this. The packed row itself carries no
    # padding (kernels that need aligned sequence starts are not used), so 1 packs tightest.
    sequence_length_round: int = 1
    # NeMo-RL: compute the loss on the packed row in one call rather than per sample. Here the packed logprobs are
    # unpacked to padded rows and the loss runs once over the microbatch either way: same numbers, so either value.
    fuse_loss: bool = False

    def check(self) -> list[tuple[str, str]]:
        if not self.enabled:
            return []
        budgets = {"train_mb_tokens": self.train_mb_tokens, "logprob_mb_tokens": self.logprob_mb_tokens}
        problems = [
            (key, "sequence packing needs a positive token budget per microbatch (e.g. 2048)")
            for key, budget in budgets.items()
            if (budget is None and key == "train_mb_tokens") or (budget is not None and budget < 1)
        ]
        if self.algorithm in ("concatenative", "first_fit_shuffle"):
            problems.append(("algorithm", f"not supported yet: NeMo-RL's {self.algorithm!r} packer; use {PACKERS}"))
        elif self.algorithm not in PACKERS:
            problems.append(("algorithm", f"must be one of {PACKERS}, got {self.algorithm!r}"))
        if self.sequence_length_round < 1:
            problems.append(("sequence_length_round", f"must be >= 1, got {self.sequence_length_round}"))
        return problems


@dataclass
class DraftConfig(SectionReads):
    """``policy.draft``: NeMo-RL's speculative-decoding draft model trained beside the policy; refused through
    ``enabled`` (the other keys configure it and do nothing while it is off)."""

    enabled: bool = False
    model_name: str | None = None  # inert: the draft model
    loss_weight: float = 0.1  # inert: the draft loss's weight
    num_layers: int | None = None  # inert: the draft's layers
    aux_layer_indices: list[int] | None = None  # inert: policy layers whose hidden states feed the draft

    def check(self) -> list[tuple[str, str]]:
        if self.enabled:
            return [("enabled", "not supported yet: training a speculative-decoding draft model; set it to false")]
        return []


ROUTER_REPLAY_GRPO_ONLY = "router replay is for GRPO runs (it replays the generation engine's routing); set it to false"


@dataclass
class RouterReplayConfig(SectionReads):
    """``policy.router_replay``: MoE routing replay. The engine records the experts it routes each token to and
    every trainer forward of those samples routes them to the same experts (docs/moe.md#router-replay)."""

    enabled: bool = False  # GRPO with the in-process engine only; refused elsewhere


# bradley_terry: a reward model scored at each row's last token (RM training, reward environments); regression: a
# critic read at every token (PPO's ``value`` section, NeMo-RL's name).
REWARD_MODEL_TYPES = ("bradley_terry", "regression")


@dataclass
class RewardModelConfig(SectionReads):
    """``policy.reward_model_cfg``: train a scalar-head (sequence-classification, 1 label) model instead of an LM."""

    enabled: bool = False  # true: the scalar-head model (RM training; PPO's value model)
    reward_model_type: str = "bradley_terry"  # what the head is read as: REWARD_MODEL_TYPES

    def check(self) -> list[tuple[str, str]]:
        if self.reward_model_type not in REWARD_MODEL_TYPES:
            return [("reward_model_type", f"must be one of {list(REWARD_MODEL_TYPES)}, got {self.reward_model_type!r}")]
        return []


@dataclass
class PolicyConfig(SectionReads):
    model_name: str = "Qwen/Qwen2.5-1.5B"  # a Hugging Face hub id, a local HF folder or a built-in name
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    train_global_batch_size: int = 512  # rows per optimizer step, over all data-parallel ranks
    train_micro_batch_size: int = 4  # rows per forward/backward on one rank; a step accumulates gbs/dp/mbs of them
    logprob_batch_size: int = 4  # rows per microbatch of the logprob passes (policy and reference)
    max_total_sequence_length: int = 512  # the longest row, prompt and response tokens, the policy trains or generates
    precision: Literal["float32", "bfloat16", "float16"] = "bfloat16"  # both backends' compute dtype
    max_grad_norm: float | None = 1.0  # DTensor backend: clip the global gradient norm to this; null: no clipping
    # Log-softmax over this many positions at a time, so the fp32 [B, S, V] never exists whole; null: all at once
    # from full logits (the token-logprob head, logits_at_loss_tokens_only, uses 1,024).
    logprob_chunk_size: int | None = None
    make_sequence_length_divisible_by: int = 1  # collated rows are padded to a multiple of this length
    refit_buffer_size_gb: float | None = None  # bucket size of the weight sync to the engines; null: 0.25 GiB
    # The DTensor backend's torch optimizer and LR scheduler; the Megatron backend builds its own from
    # megatron_cfg.optimizer / megatron_cfg.scheduler, and these must then be null.
    optimizer: OptimizerConfig | None = field(default_factory=OptimizerConfig)
    # torch LR schedulers, each {name, kwargs}, chained by one {milestones: [...]} entry; stepped once per train() call.
    scheduler: list[dict[str, Any]] | None = field(default_factory=_default_scheduler)
    dtensor_cfg: DTensorConfig = field(default_factory=DTensorConfig)
    megatron_cfg: MegatronConfig = field(default_factory=MegatronConfig)
    dynamic_batching: DynamicBatchingConfig = field(default_factory=DynamicBatchingConfig)
    sequence_packing: SequencePackingConfig = field(default_factory=SequencePackingConfig)
    generation: GenerationConfig | None = field(default_factory=GenerationConfig)
    reward_model_cfg: RewardModelConfig = field(default_factory=RewardModelConfig)
    # Set on the Hugging Face model config before the weights load, in the policy and in the vLLM engines (e.g.
    # ``{rope_scaling: {rope_type: yarn, factor: 4.0}}``); nested sections are merged key by key.
    hf_config_overrides: dict[str, Any] | None = None
    # NeMo-RL's batch size for generating with the policy's own Hugging Face model; this library generates with
    # vLLM only (generation.backend "hf" is refused), so nothing can use it.
    generation_batch_size: int | None = None
    draft: DraftConfig = field(default_factory=DraftConfig)
    router_replay: RouterReplayConfig = field(default_factory=RouterReplayConfig)
    # The optimizer state moves to CPU for each logprob pass and back for training (DTensor backend; a no-op where
    # it already lives on CPU).
    offload_optimizer_for_logprob: bool = False
    # Refused when set: see _check_unsupported_features.
    activation_checkpointing_enabled: bool = False
    dequantize_base_checkpoint: bool = False  # dequantize an FP8-quantized base checkpoint on load
    quant_cfg: str | None = None  # ModelOpt quantized training
    # Ours: the policy backend by registry name or "package.module:ATTRIBUTE" (a `PolicyBackend`); null derives it
    # from dtensor_cfg.enabled / megatron_cfg.enabled as NeMo-RL does (see `nemo_rl_clone.models.policy.backends`).
    backend: str | None = None

    def model_parallel_size(self) -> int:
        """Workers per model replica (the data-parallel size is workers / this): the backend's TP (or CP), or TP × PP."""
        return parallel_layout(self, backend_spec(self)).model_parallel_size

    def check(self) -> list[tuple[str, str]]:
        problems = _check_unsupported_features(self) + check_backend(self)
        problems += check_at_least(
            self,
            1,
            "train_global_batch_size",
            "train_micro_batch_size",
            "logprob_batch_size",
            "max_total_sequence_length",
        )
        if self.train_micro_batch_size >= 1 and self.train_global_batch_size % self.train_micro_batch_size:
            problems.append(
                (
                    "train_global_batch_size",
                    f"must be a multiple of train_micro_batch_size ({self.train_global_batch_size} % {self.train_micro_batch_size} != 0)",
                )
            )
        if self.dynamic_batching.enabled and self.sequence_packing.enabled:
            problems.append(
                ("dynamic_batching.enabled", "dynamic_batching and sequence_packing cannot both be enabled")
            )
        if self.scheduler:
            problems.extend(check_scheduler_entries(self.scheduler))
        return problems


def _check_unsupported_features(config: PolicyConfig) -> list[tuple[str, str]]:
    """Keys NeMo-RL accepts whose feature this library does not implement yet: refused when set, never ignored
    (``megatron_cfg``'s own: `nemo_rl_clone.models.policy.megatron.config`)."""
    problems = feature_problems(config)
    # Over one tensor-parallel rank there is no sequence to split: true is then a no-op (a notice at start-up).
    if config.dtensor_cfg.sequence_parallel and config.dtensor_cfg.custom_parallel_plan:
        problems.append(
            (
                "dtensor_cfg.sequence_parallel",
                "not supported yet with custom_parallel_plan (a custom plan places every activation itself: put "
                "the sequence-parallel styles in it); set it to false",
            )
        )
    refused = [
        (
            config.activation_checkpointing_enabled,
            "activation_checkpointing_enabled",
            "this top-level switch; use policy.dtensor_cfg.activation_checkpointing (or megatron_cfg's)",
        ),
        (
            config.dequantize_base_checkpoint,
            "dequantize_base_checkpoint",
            "dequantizing an FP8-quantized base checkpoint on load; start from a bf16/fp32 checkpoint",
        ),
        (
            config.offload_optimizer_for_logprob and config.megatron_cfg.enabled,
            "offload_optimizer_for_logprob",
            "with the Megatron backend (its optimizer state stays where it is); use the DTensor backend",
        ),
        (config.quant_cfg is not None, "quant_cfg", "ModelOpt quantized training; set it to null"),
    ]
    problems += [(key, f"not supported yet: {why}") for is_set, key, why in refused if is_set]
    hf_refusal = hf_overrides_refused(config, known_backend_spec(config))
    if hf_refusal:
        problems.append(("hf_config_overrides", f"not supported yet: {hf_refusal}"))
    return problems
