"""``MegatronPolicyWorker``: one rank of a Megatron Core GPT policy (tensor × pipeline × data parallel), run as a
Ray actor behind the same `Policy` facade and method contract as `DTensorPolicyWorker`.

Weights come from a Hugging Face Llama/Qwen2/Qwen3 or Qwen3-MoE model, converted in memory at start-up
(`models.policy.megatron.converter`); refit and consolidated exports convert back. MoE models may spread their experts
over expert-parallel ranks (`models.policy.megatron.moe`). Training runs Megatron's forward/backward schedules (1F1B across
pipeline stages), its DDP and (distributed) optimizer; checkpoints use Megatron's distributed checkpoint format,
which reloads at any parallel layout.

The sequence shared with the DTensor worker is `PolicyWorkerBase`'s; this module builds, runs and saves the model.
Gradient normalisation (see `PolicyWorkerBase`): Megatron's schedule divides each microbatch loss by the number of
microbatches and its DDP averages over data-parallel ranks; the loss handed to it is scaled by both.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any, cast

import megatron_cpu_shims
import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.distributed import finalize_model_grads
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, PretrainedConfig

from nemo_rl_clone.contract.loss import TokenLogprobs
from nemo_rl_clone.contract.loss_input import prepare_loss_input
from nemo_rl_clone.data.interfaces import ROUTED_EXPERTS
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.models.hf_export import to_checkpoint_layout
from nemo_rl_clone.models.huggingface import load_hf_config, reporting_model_load_errors
from nemo_rl_clone.models.policy.megatron import converter, linear_ce, moe, optimizer_checkpoint
from nemo_rl_clone.models.policy.megatron import lora as mlora
from nemo_rl_clone.models.policy.megatron import model as mmodel
from nemo_rl_clone.models.policy.megatron.packing import PackedLayout
from nemo_rl_clone.models.policy.workers import reward_model, train_step
from nemo_rl_clone.models.policy.workers.base import GlobalBatch, LossShare, MicrobatchCompute, PolicyWorkerBase
from nemo_rl_clone.models.policy.workers.train_profile import TrainProfile
from nemo_rl_clone.utils.errors import UserInputError

logger = logging.getLogger(__name__)


class MegatronPolicyWorker(PolicyWorkerBase):
    """One rank of the policy; the constructor arguments are `PolicyWorkerBase`'s. Every public method except
    the ``prepare_*``/``offload_*`` ones is a collective."""

    # ------------------------------------------------------------------ build
    def _check_runtime_support(self) -> None:
        mmodel.check_runtime_support(self.cfg.megatron_cfg)

    def _build(self, model_path: str) -> None:
        mcfg = self.cfg.megatron_cfg
        # A reward model or PPO's critic: the decoder under a scalar head (`value_head`), scored like DTensor's.
        self.is_reward_model = self.cfg.reward_model_cfg.enabled
        self.scorer = reward_model.scorer_class(self.cfg.reward_model_cfg.reward_model_type)
        with reporting_model_load_errors(model_path):
            hf_config = load_hf_config(model_path, self.cfg.hf_config_overrides)
            hf_model = (
                reward_model.load_reward_model(model_path, self.tokenizer.pad_token_id, hf_config=hf_config)
                if self.is_reward_model
                else AutoModelForCausalLM.from_pretrained(model_path, config=hf_config, dtype=torch.float32)
            )
        self.hf_config = hf_model.config
        hf_state = hf_model.state_dict()
        try:
            self.shape = converter.model_shape(self.hf_config, mcfg.converter_type)
            converter.check_tensor_parallel(self.shape, mcfg.tensor_model_parallel_size)
        except ValueError as error:
            raise UserInputError(str(error)) from None
        varying_shapes = self.cfg.dynamic_batching.enabled or self.cfg.sequence_packing.enabled
        moe.check(self.shape, mcfg, dist.get_world_size(), varying_shapes)
        for note in moe.notes(self.shape, mcfg):
            logger.info(note)
        self._set_refit_info(hf_state)
        parallelism = mmodel.Parallelism(
            tensor=mcfg.tensor_model_parallel_size,
            pipeline=mcfg.pipeline_model_parallel_size,
            first_stage_layers=mcfg.num_layers_in_first_pipeline_stage,
            last_stage_layers=mcfg.num_layers_in_last_pipeline_stage,
            expert=mcfg.expert_model_parallel_size if self.shape.is_moe else 1,
            expert_tensor=mcfg.expert_tensor_parallel_size if self.shape.is_moe else None,
            sequence=mcfg.sequence_parallel,
            context=mcfg.context_parallel_size,
        )
        mmodel.init_model_parallel(parallelism)
        self.tp_size = parallel_state.get_tensor_model_parallel_world_size()
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.packed = self.cfg.sequence_packing.enabled  # validation: cp > 1 only with packing
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.dp_group = parallel_state.get_data_parallel_group()
        self.is_last_stage = parallel_state.is_pipeline_last_stage()
        self.model_config = mmodel.transformer_config(self.shape, self.hf_config, mcfg, self.cfg.precision, parallelism)
        gpt, self.layers = mmodel.build_model(
            self.model_config, self.shape, self.hf_config, hf_state, value_head=self.is_reward_model
        )
        del hf_model, hf_state
        if self.shape.is_moe and mcfg.freeze_moe_router:
            moe.freeze_router(gpt)
        if mcfg.peft.enabled:  # before DDP: it builds gradient buffers for the adapters only
            adapted = mlora.apply(gpt, mcfg.peft)
            logger.info("rank %d: LoRA adapters (dim %d) on %d linear layers", self.rank, mcfg.peft.dim, len(adapted))
        self.routing_replay = None
        if self.cfg.router_replay.enabled:
            shard = (self.tp_rank, self.tp_size) if self.model_config.sequence_parallel else (0, 1)
            self.routing_replay = moe.RoutingReplay(gpt, shard)
        # Validation: SFT and DPO losses only, no context parallelism; the last stage alone holds the head.
        self.hidden_head = (
            linear_ce.HiddenStatesHead(gpt.output_layer)
            if mcfg.use_linear_ce_fusion_loss and self.is_last_stage
            else None
        )
        self.model = mmodel.wrap_model(gpt, self.model_config, mcfg)

    def _set_refit_info(self, hf_state: dict[str, torch.Tensor]) -> None:
        """Refit sends the names and shapes checkpoints (and vLLM) use; Qwen3-MoE fuses its experts only in memory.
        A scalar-head model is never refitted."""
        if self.is_reward_model:
            self.refit_info = {}
            return
        with torch.device("meta"):
            self._hf_layout = AutoModelForCausalLM.from_config(self.hf_config)
        meta_state = {name: torch.empty_like(tensor, device="meta") for name, tensor in hf_state.items()}
        self.refit_info = {
            name: (tensor.shape, self.dtype if tensor.is_floating_point() else tensor.dtype)
            for name, tensor in to_checkpoint_layout(self._hf_layout, meta_state).items()
        }

    def _build_optimizer(self) -> tuple[Any, Any]:
        optimizer = mmodel.build_optimizer(self.model, self.model_config, self.cfg.megatron_cfg)
        return optimizer, mmodel.build_scheduler(optimizer, self.cfg.megatron_cfg)

    # ------------------------------------------------------------------ forward / backward
    def _run_schedule(
        self,
        microbatches: list[BatchedDataDict],
        finish: Callable[..., Any],
        forward_only: bool,
        collect_outputs: bool = False,
    ) -> list[Any]:
        """Megatron's forward/backward schedule over ``microbatches``; ``finish(microbatch, logits)`` runs on the
        last pipeline stage (logits ``[B, S, V / tp]``). Training: ``finish`` returns ``(loss, metrics)`` and the
        metrics come back; ``collect_outputs`` (forward only): whatever ``finish`` returns comes back. On the last
        stage only."""

        # Each packed microbatch's layout is built once: its width sizes the schedule, its step runs the row.
        layouts = [self._packed_layout(mb) if self.packed else None for mb in microbatches]

        def forward_step(
            data_iterator: Iterator[tuple[BatchedDataDict, PackedLayout | None]], model: torch.nn.Module
        ) -> tuple[Any, Any]:
            microbatch, layout = next(data_iterator)
            microbatch = microbatch.to(self.device)
            input_ids, routing = microbatch["input_ids"], microbatch.get(ROUTED_EXPERTS)
            width = input_ids.shape[1]
            kwargs: dict[str, Any] = {}
            if self.cfg.megatron_cfg.defer_fp32_logits and self._half:
                kwargs["fp32_output"] = False
            if layout is not None:
                input_ids, positions = layout.pack(input_ids), layout.position_ids(self.device)
                kwargs["packed_seq_params"] = layout.params(self.device)
                routing = None if routing is None else layout.pack(routing, fill=-1)
            else:
                input_ids = torch.nn.functional.pad(input_ids, (0, self._padded_width(width) - width))
                positions = torch.arange(input_ids.shape[1], device=self.device).expand_as(input_ids)
            if self.routing_replay is not None:  # the engine's routing of these rows (None: the model's own)
                self.routing_replay.routing = routing
            # Right padding needs no attention mask: the causal mask keeps valid positions from seeing it.
            output = model(input_ids, positions, None, **kwargs)
            if self.routing_replay is not None:
                self.routing_replay.routing = None
            if self.is_last_stage:  # logits [B or 1, S', V / tp]; other stages pass hidden states on
                output = output[:, :width] if layout is None else layout.unpack(output)
            return output, functools.partial(finish, microbatch)

        # Packed microbatches are one row each; pipeline stages exchange each one's shape (variable_seq_lengths).
        widths = [
            mb["input_ids"].shape[1] if layout is None else layout.num_tokens
            for mb, layout in zip(microbatches, layouts, strict=True)
        ]
        return get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(zip(microbatches, layouts, strict=True)),
            model=[self.model],
            num_microbatches=len(microbatches),
            seq_length=self._padded_width(max(widths)),
            micro_batch_size=1 if self.packed else max(mb.size for mb in microbatches),
            forward_only=forward_only,
            collect_non_loss_data=collect_outputs,
        )

    def _packed_layout(self, microbatch: BatchedDataDict) -> PackedLayout:
        return PackedLayout(
            microbatch["input_lengths"],
            microbatch["input_ids"].shape[1],
            parallel_state.get_context_parallel_rank(),
            parallel_state.get_context_parallel_world_size(),
            self.tp_size if self.model_config.sequence_parallel else 1,
        )

    def _padded_width(self, width: int) -> int:
        """Sequence parallelism splits the tokens evenly over tensor-parallel ranks: rows are padded on the right."""
        if not self.model_config.sequence_parallel:
            return width
        return -(-width // self.tp_size) * self.tp_size

    @property
    def _half(self) -> bool:
        return self.model_config.bf16 or self.model_config.fp16

    def _whole_vocabulary(self, logits: torch.Tensor) -> torch.Tensor:
        """This rank's ``[B, S, V / tp]`` logits gathered over the tensor-parallel ranks; differentiable (each rank
        backpropagates into its own slice: the loss on the gathered logits is the same on every rank)."""
        if self.tp_size == 1:
            return logits
        return gather_from_tensor_model_parallel_region(logits, group=parallel_state.get_tensor_model_parallel_group())

    def _vocab_parallel(self) -> dict[str, Any]:
        if self.tp_size == 1:
            return {}
        return {
            "vocab_parallel_rank": self.tp_rank,
            "vocab_parallel_group": parallel_state.get_tensor_model_parallel_group(),
        }

    def _from_last_stage(self, value: Any) -> Any:
        if parallel_state.get_pipeline_model_parallel_world_size() == 1:
            return value
        box = [value if self.is_last_stage else None]
        dist.broadcast_object_list(
            box,
            src=parallel_state.get_pipeline_model_parallel_last_rank(),
            group=parallel_state.get_pipeline_model_parallel_group(),
        )
        return box[0]

    # ------------------------------------------------------------------ logprobs
    def _inference_outputs(
        self, data: BatchedDataDict, micro_batch_size: int, compute: MicrobatchCompute
    ) -> list[torch.Tensor]:
        def finish(microbatch: BatchedDataDict, logits: torch.Tensor, non_loss_data: bool = False) -> torch.Tensor:
            return compute(microbatch, lambda: logits).cpu()

        microbatches = list(train_step.microbatches(data, micro_batch_size))
        return self._run_schedule(microbatches, finish, forward_only=True, collect_outputs=True)

    def _after_inference(self) -> None:
        self._empty_cache(level=2)

    def _keeps_reference_weights(self) -> bool:
        return not self.is_reward_model

    def score(self, data: BatchedDataDict, micro_batch_size: int | None = None) -> BatchedDataDict:
        """A reward model's ``{"scores": [B] fp32}`` for this rank's shard, read at ``input_lengths - 1``; a critic's
        (``reward_model_type: regression``) ``[B, S]`` values of every token (`reward_model.TokenValueScorer`)."""
        if not self.is_reward_model:
            raise RuntimeError("score needs a reward model (policy.reward_model_cfg.enabled=true); this is a causal LM")
        reward_model.check_input_lengths(data, "score")
        width = data["input_ids"].shape[1]

        def scores_of(batch: BatchedDataDict, forward: Any) -> torch.Tensor:
            scores = self.scorer.from_head(forward().float(), batch["input_lengths"].to(self.device))
            return self.scorer.reported(scores, width).cpu()

        return BatchedDataDict({"scores": self._inference_pass(data, micro_batch_size, scores_of)})

    # ------------------------------------------------------------------ training
    def _zero_grad(self) -> None:
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()

    def _forward_backward(self, step: GlobalBatch) -> list[LossShare]:
        loss_fn, norm = step.loss_fn, step.norm
        scale = self.dp_size * len(step.microbatches)

        def finish(microbatch: BatchedDataDict, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
            loss_input: dict[str, Any] = {}
            if self.is_reward_model:  # `logits` are the head's [B, S, 1] outputs
                logits_or_logprobs = self.scorer.from_head(logits, microbatch["input_lengths"].to(logits.device))
            elif self.hidden_head is not None:  # `logits` are the final hidden states [B, S, H]
                logits_or_logprobs = cast(torch.Tensor, self._fused_token_logprobs(logits, microbatch, loss_fn))
            else:
                # A loss that reads whole logits (distillation's KL) gets them gathered over the TP ranks.
                whole = not getattr(loss_fn, "accepts_token_logprobs", False)
                loss_input, _ = prepare_loss_input(
                    self._whole_vocabulary(logits) if whole else logits,
                    microbatch,
                    loss_fn,
                    chunk_size=self.cfg.logprob_chunk_size,
                    **({} if whole else self._vocab_parallel()),
                )
                logits_or_logprobs = loss_input.pop("next_token_logits")
            loss, metrics = loss_fn(logits_or_logprobs, microbatch, norm.valid_seqs, norm.valid_toks, **loss_input)
            loss, metrics = train_step.scaled_loss(loss, metrics, norm)
            return loss * scale, {"loss_share": loss.detach().double().cpu(), **metrics}

        head = self.hidden_head.active() if self.hidden_head is not None else contextlib.nullcontext()
        with head:
            stored = self._run_schedule(step.microbatches, finish, forward_only=step.eval_mode)
        return [(metrics.pop("loss_share"), metrics) for metrics in stored]  # none but on the last pipeline stage

    def _fused_token_logprobs(self, hidden: torch.Tensor, microbatch: BatchedDataDict, loss_fn: Any) -> TokenLogprobs:
        """The loss's token logprobs from the final hidden states (`linear_ce`): computed everywhere, as the loss
        reads them only at its token_mask positions."""
        sampling = getattr(loss_fn, "sampling_params", None)
        if not getattr(loss_fn, "accepts_token_logprobs", False) or (sampling is not None and not sampling.is_identity):
            raise UserInputError(
                f"policy.megatron_cfg.use_linear_ce_fusion_loss: {type(loss_fn).__name__} does not read plain token "
                "logprobs; set it to false"
            )
        assert self.hidden_head is not None and self.hidden_head.weight is not None
        weight = self.hidden_head.weight
        group = parallel_state.get_tensor_model_parallel_group() if self.tp_size > 1 else None
        chunk = self.cfg.megatron_cfg.linear_ce_fusion_chunk_size or linear_ce.DEFAULT_CHUNK_SIZE
        input_ids = microbatch["input_ids"]
        return TokenLogprobs(
            linear_ce.token_logprobs(hidden, weight, input_ids, chunk, group, self.tp_rank * weight.shape[0])
        )

    def _optimizer_step(self) -> torch.Tensor:
        with megatron_cpu_shims.cuda_redirect():
            finalize_model_grads([self.model])
            success, grad_norm, _ = self.optimizer.step()
        if not success:
            logger.warning("rank %d: the optimizer skipped this step (non-finite gradients)", self.rank)
        if grad_norm is None:  # clip_grad null: Megatron does not compute the norm; report it anyway
            grad_norm = self.optimizer.get_grad_norm()
        return torch.tensor(float(grad_norm))

    def _advance_scheduler(self) -> None:
        self.scheduler.step(increment=1)

    def _after_train(self, profile: TrainProfile | None) -> None:
        self._empty_cache(level=1)

    # ------------------------------------------------------------------ placement
    def _free_cached_memory(self) -> None:
        self._empty_cache(level=1)

    def _empty_cache(self, level: int) -> None:
        """``policy.megatron_cfg.empty_unused_memory_level``: release cached GPU memory when the configured level is at
        least ``level`` (1: after training and around refits; 2: also after every logprob pass)."""
        if self.device.type == "cuda" and self.cfg.megatron_cfg.empty_unused_memory_level >= level:
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ weights for refit and export
    def prepare_refit_info(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        self._require_language_model("prepare_refit_info")
        return dict(self.refit_info)

    def get_full_state_dict_for_refit(self) -> dict[str, torch.Tensor] | None:
        """The full Hugging Face-named state dict (checkpoint layout, what the engines load) in the compute dtype, on
        CPU, on rank 0 (None elsewhere)."""
        self._require_language_model("get_full_state_dict_for_refit")
        state = mmodel.gather_hf_state_dict(self.model, self.shape, self.layers)
        if state is None:
            return None
        state = to_checkpoint_layout(self._hf_layout, state)
        return {name: tensor.to(self.dtype) if tensor.is_floating_point() else tensor for name, tensor in state.items()}

    # ------------------------------------------------------------------ checkpoints: Megatron distributed
    def _save_weights(self, path: str) -> None:
        optimizer_checkpoint.save_distributed(mmodel.unwrap(self.model).sharded_state_dict(), path)

    def _save_optimizer(self, path: str) -> None:
        # A fresh model sharded state dict: saving one replaces its tensors.
        sharded_model = mmodel.unwrap(self.model).sharded_state_dict()
        optimizer_checkpoint.save_optimizer(self.optimizer, self.scheduler, sharded_model, path)

    def _hf_export(self) -> tuple[dict[str, torch.Tensor], PretrainedConfig, Any] | None:
        full_state = mmodel.gather_hf_state_dict(self.model, self.shape, self.layers)
        if full_state is None:
            return None
        model_class = AutoModelForSequenceClassification if self.is_reward_model else AutoModelForCausalLM
        return {name: tensor.float() for name, tensor in full_state.items()}, self.hf_config, model_class

    def _load_weights(self, path: str) -> None:
        gpt = mmodel.unwrap(self.model)
        gpt.load_state_dict(dist_checkpointing.load(gpt.sharded_state_dict(), path), strict=False)

    def _load_optimizer(self, path: str | None) -> None:
        if path is None:
            with megatron_cpu_shims.cuda_redirect():
                # The optimizer's fp32 main parameters (separate copies under bf16/fp16) take the loaded weights.
                self.optimizer.reload_model_params()
            return
        sharded_model = mmodel.unwrap(self.model).sharded_state_dict()
        optimizer_checkpoint.load_optimizer(self.optimizer, self.scheduler, sharded_model, path)

    def has_router_aux_loss(self) -> bool:
        return moe.adds_load_balancing_loss(self.shape, self.cfg.megatron_cfg)

    def _destroy_parallel_state(self) -> None:
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
