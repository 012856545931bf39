"""``DTensorPolicyWorker``: one rank of an FSDP2 (+ DTensor TP) Hugging Face causal LM, run as a Ray actor.
With ``policy.reward_model_cfg.enabled`` it is a 1-label sequence-classification model instead (see `reward_model`).

The `Policy` facade starts one per bundle with ``RANK/WORLD_SIZE/MASTER_*`` set, hands each its data-parallel shard
and calls the collective methods (training, logprobs, checkpoints, full state dict) on every rank at once. The
sequence they share with the Megatron worker is `PolicyWorkerBase`'s; this module builds, runs and saves the model.

Gradient normalisation (see `PolicyWorkerBase`): FSDP averages over DP ranks, hence every backward scales the loss
by the DP size.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Iterator
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    PretrainedConfig,
    PreTrainedModel,
)

from nemo_rl_clone.contract.loss import LossFunction, TokenLogprobs
from nemo_rl_clone.contract.sampling import TrainingSamplingParams
from nemo_rl_clone.data.interfaces import ROUTED_EXPERTS
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.models.huggingface import load_hf_config, reporting_model_load_errors
from nemo_rl_clone.models.policy.dtensor import (
    automodel_options,
    bf16_backward,
    context_parallel,
    expert_parallel,
    lora,
    moe,
    weights,
)
from nemo_rl_clone.models.policy.dtensor import parallel as dtensor_parallel
from nemo_rl_clone.models.policy.workers import (
    packed_sequences,
    reward_model,
    token_logprob_head,
    train_step,
    worker_setup,
)
from nemo_rl_clone.models.policy.workers.base import (
    Forward,
    GlobalBatch,
    LossShare,
    MicrobatchCompute,
    PolicyWorkerBase,
)
from nemo_rl_clone.models.policy.workers.optim import build_optimizer, build_scheduler
from nemo_rl_clone.models.policy.workers.train_profile import TrainProfile, device_peak_flops, peak_rss_bytes
from nemo_rl_clone.utils.errors import UserInputError

logger = logging.getLogger(__name__)


class DTensorPolicyWorker(PolicyWorkerBase):
    """One rank of the policy; the constructor arguments are `PolicyWorkerBase`'s. The reference copy is not kept
    for reward models (they have no logprobs) nor with LoRA (the reference is the base model: the adapters switched
    off). Checkpoints are sharded DCP with Hugging Face names."""

    # ------------------------------------------------------------------ build
    def _build(self, model_path: str) -> None:
        config, dtensor_cfg = self.cfg, self.cfg.dtensor_cfg
        self.mesh = dtensor_parallel.build_device_mesh(
            self.device,
            dtensor_cfg.tensor_parallel_size,
            dtensor_cfg.context_parallel_size,
            dtensor_cfg.dp_replicate_size,
        )
        self.dp_size = self.mesh["dp"].size()
        self.dp_group = self.mesh["dp"].get_group()
        # fp32 master weights on every rank; FSDP casts to `self.dtype` for compute.
        self.is_reward_model = config.reward_model_cfg.enabled
        self.packed = config.sequence_packing.enabled  # validation: SDPA attention only
        model = self._load_model(model_path)
        model.config.use_cache = False
        automodel_options.freeze(model, dtensor_cfg.automodel_kwargs.get("freeze_config"), self.rank)
        if dtensor_cfg.sequence_parallel and dtensor_cfg.tensor_parallel_size == 1 and self.rank == 0:
            print(
                "dtensor_cfg.sequence_parallel: true has no effect with tensor_parallel_size 1",
                file=sys.stderr,
                flush=True,
            )
        self.router_loss = moe.RouterAuxLoss(model.config) if moe.num_routed_experts(model.config) else None
        self._router_logits: tuple[torch.Tensor, ...] = ()
        self.lora = dtensor_cfg.lora_cfg if dtensor_cfg.lora_cfg.enabled else None
        if self.lora is not None:
            adapted = lora.apply(model, self.lora)
            logger.info("rank %d: LoRA adapters (dim %d) on %d linear layers", self.rank, self.lora.dim, len(adapted))
        self._install_heads(model)
        plan = None
        if self.mesh["tp"].size() > 1:
            plan = dtensor_parallel.tensor_parallel_plan(model, dtensor_cfg.custom_parallel_plan)
            if dtensor_cfg.sequence_parallel:  # validation: not with a custom plan
                plan = dtensor_parallel.sequence_parallel_plan(model, plan)
        ep_size = dtensor_cfg.expert_parallel_size
        self.model = dtensor_parallel.parallelize(
            model,
            self.mesh,
            param_dtype=self.dtype,
            tensor_parallel_plan=plan,
            activation_checkpointing=dtensor_cfg.activation_checkpointing,
            cpu_offload=dtensor_cfg.cpu_offload,
            expert_mesh=expert_parallel.build_mesh(self.device.type, ep_size) if ep_size > 1 else None,
        )
        self.routing_replay = moe.RoutingReplay(self.model) if config.router_replay.enabled else None
        self.num_parameters = sum(param.numel() for param in self.model.parameters())  # DTensors count in full
        self.num_trainable_parameters = sum(param.numel() for param in self._trainable_parameters())
        self.scorer = (
            reward_model.make_scorer(self.model, config.reward_model_cfg.reward_model_type)
            if self.is_reward_model
            else None
        )
        self.optimizer_steps = 0  # taken by this worker (for dtensor_cfg.clear_cache_every_n_steps)

    def _load_model(self, model_path: str) -> PreTrainedModel:
        """The Hugging Face model in fp32 with the attention packing or context parallelism needs."""
        dtensor_cfg = self.cfg.dtensor_cfg
        attn_implementation = packed_sequences.PACKED_ATTENTION if self.packed else dtensor_cfg.hf_attention
        self.context_parallel: context_parallel.ContextParallel | None = None
        if dtensor_cfg.context_parallel_size > 1:  # validation: no packing, TP or reward model with it
            self.context_parallel = context_parallel.ContextParallel(self.mesh["cp"])
            attn_implementation = context_parallel.ATTENTION
        with reporting_model_load_errors(model_path):
            hf_config = load_hf_config(model_path, self.cfg.hf_config_overrides)
            refused = moe.refusal(
                hf_config, dtensor_cfg.tensor_parallel_size, dtensor_cfg.context_parallel_size
            ) or expert_parallel.refusal(
                moe.num_routed_experts(hf_config), dtensor_cfg.expert_parallel_size, self.mesh["dp"].size()
            )
            if refused:
                raise UserInputError(refused)
            if self.is_reward_model:
                return reward_model.load_reward_model(
                    model_path, self.tokenizer.pad_token_id, attn_implementation, hf_config=hf_config
                )
            return AutoModelForCausalLM.from_pretrained(
                model_path, config=hf_config, dtype=torch.float32, attn_implementation=attn_implementation
            )

    def _install_heads(self, model: PreTrainedModel) -> None:
        """The selective LM head (token logprobs at the loss's tokens only) and the bf16 backward, where they apply."""
        dtensor_cfg = self.cfg.dtensor_cfg
        self._head_mode: tuple[TrainingSamplingParams | None, bool] = (None, False)
        self.selective_head: token_logprob_head.SelectiveLMHead | None = None
        if (
            dtensor_cfg.logits_at_loss_tokens_only
            and not self.is_reward_model
            and dtensor_cfg.tensor_parallel_size == 1
        ):
            self.selective_head = token_logprob_head.install(model)
        self.grad_dtype = worker_setup.backward_dtype(self.dtype, dtensor_cfg.backward_precision, self.device)
        if self.grad_dtype != self.dtype and dtensor_cfg.tensor_parallel_size == 1:
            bf16_backward.install(model, skip=self.selective_head)
        else:
            self.grad_dtype = self.dtype  # TP shards the linear layers itself: their backward stays as it is

    def _trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [param for param in self.model.parameters() if param.requires_grad]

    def _keeps_reference_weights(self) -> bool:
        return not self.is_reward_model and self.lora is None

    def _build_optimizer(self) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
        assert self.cfg.optimizer is not None, "validation refuses policy.optimizer=null with the DTensor backend"
        optimizer = build_optimizer(self._trainable_parameters(), self.cfg.optimizer)
        return optimizer, build_scheduler(optimizer, self.cfg.scheduler)

    # ------------------------------------------------------------------ forward passes
    def _rows(self, batch: BatchedDataDict) -> packed_sequences.PaddedRows | packed_sequences.PackedRows:
        # Built on the model's device: the packed position ids go into the model beside the device's input ids.
        return packed_sequences.rows_for(batch["input_ids"].to(self.device), batch.get("input_lengths"), self.packed)

    def _run_model(
        self,
        rows: packed_sequences.PaddedRows | packed_sequences.PackedRows,
        input_ids: torch.Tensor,
        selection: tuple[torch.Tensor, torch.Tensor] | tuple[()] = (),
        routing: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The model's ``.logits`` for ``input_ids`` ``[B, S]``, in that padded layout whether it runs packed, split
        over context-parallel ranks or as is; with ``selection`` (positions, targets ``[B, S]``) the selective head's
        token logprobs instead; with ``routing`` (``[B, S, layers, k]``) and router replay on, routed as recorded.
        Right padding needs no attention mask: the causal mask already keeps every valid position from seeing the
        padding after it."""
        if self.context_parallel is not None:  # validation: no MoE model, so no routing, with it
            return self.context_parallel.run(self._model_output, [input_ids, *selection])
        if self.routing_replay is not None and routing is not None:
            packed = rows.pack(routing.to(self.device))
            self.routing_replay.routing = packed.reshape(-1, *packed.shape[-2:])  # the model's token order
        try:
            output = self._model_output(rows.pack(input_ids), *(rows.pack(t) for t in selection), **rows.model_kwargs())
        finally:
            if self.routing_replay is not None:
                self.routing_replay.routing = None
        return rows.unpack(output)

    def _model_output(self, input_ids: torch.Tensor, *selection: torch.Tensor, **model_kwargs: Any) -> torch.Tensor:
        selecting: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if selection:
            assert self.selective_head is not None
            positions, targets = selection
            chunk_size = self.cfg.logprob_chunk_size or token_logprob_head.DEFAULT_CHUNK_SIZE
            sampling, also_unfiltered = self._head_mode
            selecting = self.selective_head.selecting(
                token_logprob_head.Selection(
                    positions, targets, chunk_size, self.dtype, self.grad_dtype, sampling, also_unfiltered
                )
            )
        if self.router_loss is not None and torch.is_grad_enabled():
            model_kwargs.update(self.router_loss.model_kwargs())
        with selecting:
            output = self.model(input_ids=input_ids, use_cache=False, **model_kwargs)
        self._router_logits = tuple(getattr(output, "router_logits", None) or ())
        return output.logits

    def _forward(self, batch: BatchedDataDict) -> torch.Tensor:
        """Next-token logits ``[B, S, V]``, or a reward model's scores: ``[B, 1]`` at each row's last valid token, or
        a critic's ``[B, S]`` per-token values (`reward_model.TokenValueScorer`); compute dtype."""
        input_ids = batch["input_ids"].to(self.device)
        if self.scorer is not None:
            return self.scorer(input_ids, batch["input_lengths"].to(self.device), self._rows(batch))
        return self._run_model(self._rows(batch), input_ids, routing=batch.get(ROUTED_EXPERTS))

    def _token_logprobs(
        self,
        batch: BatchedDataDict,
        wanted: torch.Tensor,
        sampling: TrainingSamplingParams | None = None,
        also_unfiltered: bool = False,
    ) -> torch.Tensor:
        """``[B, S - 1]`` fp32 next-token logprobs where ``wanted`` ``[B, S - 1]`` is set, 0 elsewhere, projected
        onto the vocabulary at those positions only (needs `selective_head`); under ``sampling``'s processing, and
        ``[B, S - 1, 2]`` with the temperature-only logprobs beside them when ``also_unfiltered``."""
        input_ids = batch["input_ids"].to(self.device)
        selection = token_logprob_head.next_token_selection(input_ids, wanted.to(self.device))
        self._head_mode = (sampling, also_unfiltered)
        try:
            return self._run_model(self._rows(batch), input_ids, selection, batch.get(ROUTED_EXPERTS))[:, :-1]
        finally:
            self._head_mode = (None, False)

    def _loss_input(self, batch: BatchedDataDict, loss_fn: LossFunction) -> torch.Tensor:
        """What ``loss_fn`` reads: token logprobs at its ``token_mask`` positions (under the loss's
        ``sampling_params``; with the unfiltered ones too when its KL term needs them) when it accepts them and the
        selective head is on, else the full next-token logits."""
        if self.selective_head is not None and getattr(loss_fn, "accepts_token_logprobs", False):
            sampling = getattr(loss_fn, "sampling_params", None)
            both = bool(getattr(loss_fn, "needs_unfiltered_logprobs", False))
            lp = self._token_logprobs(batch, batch["token_mask"][:, 1:] > 0, sampling, both)
            token_logprobs = TokenLogprobs(lp[..., 0], lp[..., 1]) if both else TokenLogprobs(lp)
            # Typed as logits for the LossFunction protocol; only a loss that declared it takes TokenLogprobs.
            return cast(torch.Tensor, token_logprobs)
        return self._forward(batch)

    def _inference_outputs(
        self, data: BatchedDataDict, micro_batch_size: int, compute: MicrobatchCompute
    ) -> list[torch.Tensor]:
        """Shards may differ in size by one sample; ranks with fewer microbatches run dummy forwards so that FSDP's
        per-forward collectives stay matched."""
        count = torch.tensor(train_step.count_microbatches(data, micro_batch_size))
        dist.all_reduce(count, op=dist.ReduceOp.MAX, group=self.dp_group)
        outputs = [
            compute(batch, functools.partial(self._forward, batch))
            for batch in train_step.microbatches(data, micro_batch_size)
        ]
        for _ in range(int(count) - len(outputs)):
            self._forward(data.slice(0, 1))  # output unused: only the collectives matter
        return outputs

    def _after_inference(self) -> None:
        self._reshard()

    def _microbatch_logprobs(
        self, microbatch: BatchedDataDict, forward: Forward, sampling: TrainingSamplingParams
    ) -> torch.Tensor:
        if self.selective_head is None:
            return super()._microbatch_logprobs(microbatch, forward, sampling)
        return train_step.logprobs_within_lengths(
            microbatch, lambda b, wanted: self._token_logprobs(b, wanted, sampling)
        )

    def score(self, data: BatchedDataDict, micro_batch_size: int | None = None) -> BatchedDataDict:
        """A reward model's ``{"scores": [B] fp32}`` for this rank's shard, each read at ``input_lengths - 1``; a
        critic's (``reward_model_type: regression``) ``[B, S]`` values of every token."""
        scorer = self.scorer
        if scorer is None:
            raise RuntimeError("score needs a reward model (policy.reward_model_cfg.enabled=true); this is a causal LM")
        width = data["input_ids"].shape[1]

        def scores_of(batch: BatchedDataDict, forward: Forward) -> torch.Tensor:
            return scorer.reported(forward().float(), width).cpu()

        scores = self._inference_pass(data, micro_batch_size, scores_of)
        return BatchedDataDict({"scores": scores})

    @contextlib.contextmanager
    def _reference_model(self) -> Iterator[None]:
        with lora.adapters_disabled(self.model) if self.lora is not None else super()._reference_model():
            yield

    # ------------------------------------------------------------------ training
    def _new_train_profile(self) -> TrainProfile:
        return TrainProfile(
            num_parameters=self.num_parameters,
            trainable_parameters=self.num_trainable_parameters,
            peak_flops=device_peak_flops(self.device, self.dtype),
        )

    def _zero_grad(self) -> None:
        assert self.optimizer is not None, "train() needs a policy built with init_optimizer=True"
        self.optimizer.zero_grad(set_to_none=True)

    def _forward_backward(self, step: GlobalBatch) -> list[LossShare]:
        loss_fn, norm, profile = step.loss_fn, step.norm, step.profile
        assert profile is not None  # `_new_train_profile` makes one
        shares: list[LossShare] = []
        for microbatch in step.microbatches:
            microbatch = microbatch.to(self.device)
            profile.count_microbatch(microbatch, self._rows(microbatch).num_tokens)
            with profile.timed("forward_s", self.device):
                loss, metrics = loss_fn(
                    self._loss_input(microbatch, loss_fn),
                    microbatch,
                    norm.valid_seqs,
                    norm.valid_toks,
                    logprob_chunk_size=self.cfg.logprob_chunk_size,
                )
                loss, metrics = train_step.scaled_loss(loss, metrics, norm)
                if self.router_loss is not None and self._router_logits:
                    share = 1.0 / (len(step.microbatches) * self.dp_size)  # of the step's mean router loss
                    valid = microbatch.get("input_lengths") if not self.packed else None
                    loss, metrics = self.router_loss.add_to(loss, metrics, self._router_logits, valid, share)
                    self._router_logits = ()
            if not step.eval_mode:
                with profile.timed("backward_s", self.device):
                    (loss * self.dp_size).backward()
            shares.append((loss.detach().double().cpu(), metrics))
        return shares

    def _optimizer_step(self) -> torch.Tensor:
        grad_norm = dtensor_parallel.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        if torch.isfinite(grad_norm):
            assert self.optimizer is not None
            self.optimizer.step()
        else:
            logger.warning("rank %d: non-finite grad norm %s; skipping this optimizer step", self.rank, grad_norm)
        return grad_norm.detach().cpu()

    def _after_optimizer_step(self) -> None:
        self.optimizer_steps += 1
        if worker_setup.clear_cache_due(self.optimizer_steps, self.cfg.dtensor_cfg.clear_cache_every_n_steps):
            self._empty_cache()

    def _advance_scheduler(self) -> None:
        self.scheduler.step()

    def _after_train(self, profile: TrainProfile | None) -> None:
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)  # gradients are not needed until the next train call
        self._reshard()  # an eval-mode pass leaves the root gathered, see `reshard`
        worker_setup.release_freed_memory(self.device)
        assert profile is not None
        profile.peak_rss_bytes = peak_rss_bytes()

    # ------------------------------------------------------------------ placement
    def _reshard(self) -> None:
        dtensor_parallel.reshard(self.model)

    def _move_model(self, device: torch.device) -> None:
        if self.device.type == "cpu" or self.cfg.dtensor_cfg.cpu_offload:
            return  # nothing lives elsewhere, or FSDP's CPU offload already decides where the shards live
        self.model.to(device)  # FSDP2's `_apply` re-points its sharded parameters after the move

    def _move_optimizer_state(self, device: torch.device) -> None:
        if self.device.type == "cpu" or self.optimizer is None or self.cfg.dtensor_cfg.cpu_offload:
            return  # with CPU offload the optimizer state already lives on CPU
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.device != device:
                    state[key] = value.to(device, non_blocking=True)

    def _free_cached_memory(self) -> None:
        self._empty_cache()

    def _empty_cache(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ weights for refit and export
    def prepare_refit_info(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        self._require_language_model("prepare_refit_info")
        return weights.refit_info(self.model, self.lora, self.dtype)

    def get_full_state_dict_for_refit(self) -> dict[str, torch.Tensor] | None:
        """The full (unsharded) Hugging Face state dict, in the checkpoint layout the engines load, in the compute
        dtype, on CPU, on rank 0 (None on the other ranks). A collective: every rank must call it."""
        self._require_language_model("get_full_state_dict_for_refit")
        state = weights.full_state_dict(self.model, self.lora)
        return weights.for_engines(self.model, state, self.dtype) if self.rank == 0 else None

    # ------------------------------------------------------------------ checkpoints: sharded DCP
    def _save_weights(self, path: str) -> None:
        dcp.save({"model": weights.checkpoint_model_state(self.model, self.lora)}, checkpoint_id=path)

    def _save_optimizer(self, path: str) -> None:
        dcp.save(self._optimizer_checkpoint_state(), checkpoint_id=path)

    def _hf_export(self) -> tuple[dict[str, torch.Tensor], PretrainedConfig, Any] | None:
        """fp32 master weights."""
        full_state = weights.full_state_dict(self.model, self.lora)
        if self.rank != 0:
            return None
        model_class = AutoModelForSequenceClassification if self.is_reward_model else AutoModelForCausalLM
        return full_state, cast(PretrainedConfig, self.model.config), model_class

    def _load_weights(self, path: str) -> None:
        model_state = {"model": weights.checkpoint_model_state(self.model, self.lora)}
        dcp.load(model_state, checkpoint_id=path)  # raises if the checkpoint lacks any of these keys
        set_model_state_dict(self.model, model_state["model"], options=StateDictOptions(strict=self.lora is None))
        self._reshard()

    def _load_optimizer(self, path: str | None) -> None:
        if path is None:
            return
        state = self._optimizer_checkpoint_state()
        dcp.load(state, checkpoint_id=path)
        set_optimizer_state_dict(self.model, self.optimizer, state["optim"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])

    def _optimizer_checkpoint_state(self) -> dict[str, Any]:
        assert self.optimizer is not None and self.scheduler is not None
        return {
            "optim": get_optimizer_state_dict(self.model, self.optimizer),
            "scheduler": self.scheduler.state_dict(),
        }

    def has_router_aux_loss(self) -> bool:
        return self.router_loss is not None and self.router_loss.coef > 0
