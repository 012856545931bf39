"""``MegatronPolicyWorker``: one rank of a Megatron Core GPT policy (tensor × pipeline × data parallel), run as a
Ray actor behind the same `Policy` facade and method contract as `DTensorPolicyWorker`.

Weights come from a Hugging Face Llama/Qwen2/Qwen3 or Qwen3-MoE model, converted in memory at start-up
(`models.policy.megatron.converter`); refit and consolidated exports convert back. MoE models may spread their experts
over expert-parallel ranks (`models.policy.megatron.moe`). Training runs Megatron's forward/backward schedules (1F1B across
pipeline stages), its DDP and (distributed) optimizer; checkpoints use Megatron's distributed checkpoint format,
which reloads at any parallel layout.

Gradient normalisation: a loss returns its microbatch's share of the global mean (see `DTensorPolicyWorker`), so the
global gradient is the sum of the data-parallel ranks' gradients. Megatron's schedule divides each microbatch loss by
the number of microbatches and its DDP averages over data-parallel ranks; the loss handed to it is scaled by both.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import megatron_cpu_shims
import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.distributed import finalize_model_grads
from megatron.core.pipeline_parallel import get_forward_backward_func
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase

from nemo_rl_clone.contract.loss import LossFunction
from nemo_rl_clone.contract.loss_input import prepare_loss_input
from nemo_rl_clone.contract.sampling import TrainingSamplingParams
from nemo_rl_clone.data.interfaces import ROUTED_EXPERTS
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.models.hf_export import save_consolidated_hf, to_checkpoint_layout
from nemo_rl_clone.models.huggingface import reporting_model_load_errors
from nemo_rl_clone.models.policy.config import PolicyConfig
from nemo_rl_clone.models.policy.megatron import converter, moe, optimizer_checkpoint
from nemo_rl_clone.models.policy.megatron import model as mmodel
from nemo_rl_clone.models.policy.workers import train_step, worker_setup
from nemo_rl_clone.models.policy.workers.refit_sender import RefitSender
from nemo_rl_clone.utils.errors import UserInputError

logger = logging.getLogger(__name__)


class MegatronPolicyWorker(RefitSender):
    """One rank of the policy; the constructor arguments are `DTensorPolicyWorker`'s. Every public method except
    the ``prepare_*``/``offload_*`` ones is a collective."""

    def __init__(
        self,
        config: PolicyConfig,
        tokenizer: PreTrainedTokenizerBase,
        model_path: str,
        weights_path: str | None = None,
        optimizer_path: str | None = None,
        init_optimizer: bool = True,
        init_reference_model: bool = True,
    ) -> None:
        self.cfg = config
        self.tokenizer = tokenizer
        # The sampler's processing (temperature, top-k, top-p) that the policy's logprobs reproduce.
        self.sampling = TrainingSamplingParams.from_generation(config.generation)
        mcfg = config.megatron_cfg
        mmodel.check_runtime_support(mcfg)
        self.device = worker_setup.init_distributed()
        self.rank = dist.get_rank()
        self.dtype = worker_setup.PRECISION_DTYPES[config.precision]
        with reporting_model_load_errors(model_path):
            hf_model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.hf_config = hf_model.config
        hf_state = hf_model.state_dict()
        try:
            self.shape = converter.model_shape(self.hf_config, mcfg.converter_type)
            converter.check_tensor_parallel(self.shape, mcfg.tensor_model_parallel_size)
        except ValueError as error:
            raise UserInputError(str(error)) from None
        varying_shapes = config.dynamic_batching.enabled or config.sequence_packing.enabled
        moe.check(self.shape, mcfg, dist.get_world_size(), varying_shapes)
        for note in moe.notes(self.shape, mcfg):
            logger.info(note)
        # Refit sends the names and shapes checkpoints (and vLLM) use; Qwen3-MoE fuses its experts only in memory.
        with torch.device("meta"):
            self._hf_layout = AutoModelForCausalLM.from_config(self.hf_config)
        meta_state = {name: torch.empty_like(tensor, device="meta") for name, tensor in hf_state.items()}
        self.refit_info = {
            name: (tensor.shape, self.dtype if tensor.is_floating_point() else tensor.dtype)
            for name, tensor in to_checkpoint_layout(self._hf_layout, meta_state).items()
        }
        parallelism = mmodel.Parallelism(
            tensor=mcfg.tensor_model_parallel_size,
            pipeline=mcfg.pipeline_model_parallel_size,
            first_stage_layers=mcfg.num_layers_in_first_pipeline_stage,
            last_stage_layers=mcfg.num_layers_in_last_pipeline_stage,
            expert=mcfg.expert_model_parallel_size if self.shape.is_moe else 1,
            expert_tensor=mcfg.expert_tensor_parallel_size if self.shape.is_moe else None,
            sequence=mcfg.sequence_parallel,
        )
        mmodel.init_model_parallel(parallelism)
        self.tp_size = parallel_state.get_tensor_model_parallel_world_size()
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.dp_group = parallel_state.get_data_parallel_group()
        self.is_last_stage = parallel_state.is_pipeline_last_stage()
        self.model_config = mmodel.transformer_config(self.shape, self.hf_config, mcfg, config.precision, parallelism)
        gpt, self.layers = mmodel.build_model(self.model_config, self.shape, self.hf_config, hf_state)
        del hf_model, hf_state
        if self.shape.is_moe and mcfg.freeze_moe_router:
            moe.freeze_router(gpt)
        self.routing_replay = None
        if config.router_replay.enabled:
            shard = (self.tp_rank, self.tp_size) if self.model_config.sequence_parallel else (0, 1)
            self.routing_replay = moe.RoutingReplay(gpt, shard)
        self.model = mmodel.wrap_model(gpt, self.model_config, mcfg)
        self.reference_weights: dict[str, torch.Tensor] | None = None
        if init_reference_model:
            self.reference_weights = {
                name: param.detach().to("cpu", copy=True) for name, param in self.model.named_parameters()
            }
        self.optimizer: Any = None
        self.scheduler: Any = None
        if init_optimizer:
            self.optimizer = mmodel.build_optimizer(self.model, self.model_config, mcfg)
            self.scheduler = mmodel.build_scheduler(self.optimizer, mcfg)
        if weights_path:
            self.load_checkpoint(weights_path, optimizer_path)

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

        def forward_step(data_iterator: Iterator[BatchedDataDict], model: torch.nn.Module) -> tuple[Any, Any]:
            microbatch = next(data_iterator).to(self.device)
            input_ids = microbatch["input_ids"]
            width = input_ids.shape[1]
            input_ids = torch.nn.functional.pad(input_ids, (0, self._padded_width(width) - width))
            positions = torch.arange(input_ids.shape[1], device=self.device).expand_as(input_ids)
            kwargs = {"fp32_output": False} if self.cfg.megatron_cfg.defer_fp32_logits and self._half else {}
            if self.routing_replay is not None:  # the engine's routing of these rows (None: the model's own)
                self.routing_replay.routing = microbatch.get(ROUTED_EXPERTS)
            # Right padding needs no attention mask: the causal mask keeps valid positions from seeing it.
            output = model(input_ids, positions, None, **kwargs)
            if self.routing_replay is not None:
                self.routing_replay.routing = None
            if self.is_last_stage:  # logits [B, S', V / tp]; other stages pass hidden states on
                output = output[:, :width]
            return output, functools.partial(finish, microbatch)

        return get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(microbatches),
            model=[self.model],
            num_microbatches=len(microbatches),
            seq_length=self._padded_width(max(mb["input_ids"].shape[1] for mb in microbatches)),
            micro_batch_size=max(mb.size for mb in microbatches),
            forward_only=forward_only,
            collect_non_loss_data=collect_outputs,
        )

    def _padded_width(self, width: int) -> int:
        """Sequence parallelism splits the tokens evenly over tensor-parallel ranks: rows are padded on the right."""
        if not self.model_config.sequence_parallel:
            return width
        return -(-width // self.tp_size) * self.tp_size

    @property
    def _half(self) -> bool:
        return self.model_config.bf16 or self.model_config.fp16

    def _vocab_parallel(self) -> dict[str, Any]:
        if self.tp_size == 1:
            return {}
        return {
            "vocab_parallel_rank": self.tp_rank,
            "vocab_parallel_group": parallel_state.get_tensor_model_parallel_group(),
        }

    def _from_last_stage(self, value: Any) -> Any:
        """``value`` as computed on the last pipeline stage, on every stage."""
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
    def _inference_pass(
        self, data: BatchedDataDict, micro_batch_size: int | None, compute: Callable[[BatchedDataDict, Any], Any]
    ) -> torch.Tensor:
        train_step.require_keys(data, ("input_ids", "input_lengths"))
        microbatches = list(train_step.microbatches(data, micro_batch_size or self.cfg.logprob_batch_size))
        self.model.eval()

        def finish(microbatch: BatchedDataDict, logits: torch.Tensor, non_loss_data: bool = False) -> torch.Tensor:
            return compute(microbatch, logits).cpu()

        with torch.no_grad():
            outputs = self._run_schedule(microbatches, finish, forward_only=True, collect_outputs=True)
        return self._from_last_stage(torch.cat(outputs) if self.is_last_stage else None)

    def get_logprobs(
        self, data: BatchedDataDict, micro_batch_size: int | None = None, filtered: bool = True
    ) -> BatchedDataDict:
        """``{"logprobs": [B, S] fp32}`` of this rank's shard (layout: `train_step.spec_logprobs`), under the
        sampler's processing (``policy.generation``'s temperature, and its top-k/top-p unless ``filtered`` is
        false)."""
        width = data["input_ids"].shape[1]
        sampling = self.sampling if filtered else self.sampling.unfiltered()

        def logprobs(microbatch: BatchedDataDict, logits: torch.Tensor) -> torch.Tensor:
            lp = train_step.spec_logprobs(
                logits,
                microbatch["input_ids"],
                microbatch["input_lengths"],
                self.cfg.logprob_chunk_size,
                sampling=sampling,
                **self._vocab_parallel(),
            )
            return train_step.pad_to_width(lp, width)

        result = BatchedDataDict({"logprobs": self._inference_pass(data, micro_batch_size, logprobs)})
        self._empty_cache(level=2)
        return result

    def score(self, data: BatchedDataDict, micro_batch_size: int | None = None) -> BatchedDataDict:
        raise RuntimeError("the Megatron backend trains causal LMs; reward models (score) need the DTensor backend")

    @torch.no_grad()
    def get_reference_policy_logprobs(
        self, data: BatchedDataDict, micro_batch_size: int | None = None
    ) -> BatchedDataDict:
        """``{"reference_logprobs": [B, S]}``: `get_logprobs` under the frozen initial weights, temperature-scaled but
        not top-k/top-p filtered (the KL term's distribution)."""
        with self._reference_weights_loaded():
            logprobs = self.get_logprobs(data, micro_batch_size, filtered=False)["logprobs"]
        return BatchedDataDict({"reference_logprobs": logprobs})

    @contextlib.contextmanager
    def _reference_weights_loaded(self) -> Iterator[None]:
        if self.reference_weights is None:
            raise RuntimeError("this policy was created with init_reference_model=False; it has no reference model")
        params = dict(self.model.named_parameters())
        current = {name: param.detach().to("cpu", copy=True) for name, param in params.items()}
        for name, param in params.items():
            param.data.copy_(self.reference_weights[name])
        try:
            yield
        finally:
            for name, param in params.items():
                param.data.copy_(current[name])

    # ------------------------------------------------------------------ training
    def train(
        self,
        data: BatchedDataDict,
        loss_fn: LossFunction,
        eval_mode: bool = False,
        gbs: int | None = None,
        mbs: int | None = None,
        loss_normalization: list[tuple[float, float]] | None = None,
    ) -> dict[str, Any]:
        """Optimizer steps over this rank's shard, one per global batch; takes and returns what
        `DTensorPolicyWorker.train` does (``global_loss``, ``grad_norm``, ``all_mb_metrics``), identical on every
        pipeline stage."""
        if self.optimizer is None and not eval_mode:
            raise RuntimeError("this policy was created with init_optimizer=False; it cannot train")
        gbs = gbs or self.cfg.train_global_batch_size
        mbs = mbs or self.cfg.train_micro_batch_size
        local_gbs = gbs // self.dp_size
        self.model.train(not eval_mode)
        losses, grad_norms = [], []
        all_mb_metrics: dict[str, list[Any]] = defaultdict(list)
        for index in range(data.size // local_gbs):
            batch = data.get_batch(index, local_gbs)
            norm = train_step.global_batch_normalization(batch, self.dp_group, loss_normalization, index, loss_fn)
            microbatches = list(train_step.microbatches(batch, mbs))
            scale = self.dp_size * len(microbatches)

            def finish(
                microbatch: BatchedDataDict, logits: torch.Tensor, *, _norm=norm, _scale=scale
            ) -> tuple[torch.Tensor, dict[str, Any]]:
                loss_input, _ = prepare_loss_input(
                    logits, microbatch, loss_fn, chunk_size=self.cfg.logprob_chunk_size, **self._vocab_parallel()
                )
                logits_or_logprobs = loss_input.pop("next_token_logits")
                loss, metrics = loss_fn(
                    logits_or_logprobs, microbatch, _norm.valid_seqs, _norm.valid_toks, **loss_input
                )
                loss, metrics = train_step.scaled_loss(loss, metrics, _norm)
                return loss * _scale, {"loss_share": loss.detach().double().cpu(), **metrics}

            if not eval_mode:
                self.model.zero_grad_buffer()
                self.optimizer.zero_grad()
            with torch.set_grad_enabled(not eval_mode):
                stored = self._run_schedule(microbatches, finish, forward_only=eval_mode)
            grad_norms.append(self._optimizer_step() if not eval_mode else torch.tensor(0.0))
            step_loss = torch.zeros((), dtype=torch.float64)
            step_metrics: dict[str, list[Any]] = defaultdict(list)
            for metrics in stored:  # empty except on the last pipeline stage
                step_loss += metrics.pop("loss_share")
                metrics |= {
                    "lr": self._lr(),
                    **norm.reported_counts(),
                }
                for key, value in metrics.items():
                    step_metrics[key].append(value)
            if self.is_last_stage:
                dist.all_reduce(step_loss, group=self.dp_group)
            step_loss, step_metrics = self._from_last_stage((step_loss, dict(step_metrics)))
            losses.append(step_loss.float())
            for key, values in step_metrics.items():
                all_mb_metrics[key].extend(values)
        if not eval_mode and self.scheduler is not None:
            self.scheduler.step(increment=1)
        self._empty_cache(level=1)
        return {
            "global_loss": torch.stack(losses) if losses else torch.zeros(0),
            "grad_norm": torch.stack(grad_norms).float().cpu() if grad_norms else torch.zeros(0),
            "all_mb_metrics": dict(all_mb_metrics),
        }

    def _optimizer_step(self) -> torch.Tensor:
        with megatron_cpu_shims.cuda_redirect():
            finalize_model_grads([self.model])
            success, grad_norm, _ = self.optimizer.step()
        if not success:
            logger.warning("rank %d: the optimizer skipped this step (non-finite gradients)", self.rank)
        if grad_norm is None:  # clip_grad null: Megatron does not compute the norm; report it anyway
            grad_norm = self.optimizer.get_grad_norm()
        return torch.tensor(float(grad_norm))

    def _lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"] if self.optimizer is not None else 0.0

    # ------------------------------------------------------------------ placement
    def prepare_for_training(self) -> None:
        self.model.train()

    def prepare_for_lp_inference(self) -> None:
        self.model.eval()

    def finish_training(self) -> None:
        """Nothing to release."""

    def offload_before_refit(self) -> None:
        self._empty_cache(level=1)

    def offload_after_refit(self) -> None:
        self._empty_cache(level=1)

    def _empty_cache(self, level: int) -> None:
        """``policy.megatron_cfg.empty_unused_memory_level``: release cached GPU memory when the configured level is at
        least ``level`` (1: after training and around refits; 2: also after every logprob pass)."""
        if self.device.type == "cuda" and self.cfg.megatron_cfg.empty_unused_memory_level >= level:
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ weights for refit and export
    def prepare_refit_info(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        """``{hf_name: (full shape, dtype)}`` of what `get_full_state_dict_for_refit` returns (no collective)."""
        return dict(self.refit_info)

    def get_full_state_dict_for_refit(self) -> dict[str, torch.Tensor] | None:
        """The full Hugging Face-named state dict (checkpoint layout, what the engines load) in the compute dtype, on
        CPU, on rank 0 (None elsewhere)."""
        state = mmodel.gather_hf_state_dict(self.model, self.shape, self.layers)
        if state is None:
            return None
        state = to_checkpoint_layout(self._hf_layout, state)
        return {name: tensor.to(self.dtype) if tensor.is_floating_point() else tensor for name, tensor in state.items()}

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(
        self,
        weights_path: str,
        optimizer_path: str | None = None,
        tokenizer_path: str | None = None,
        save_hf_path: str | None = None,
        save_hf_format: str = "safetensors",
    ) -> None:
        """Megatron distributed checkpoints of the model and (with ``optimizer_path``) of the optimizer and
        scheduler; tokenizer files; a consolidated Hugging Face folder at ``save_hf_path``. A collective."""
        gpt = mmodel.unwrap(self.model)
        optimizer_checkpoint.save_distributed(gpt.sharded_state_dict(), weights_path)
        if optimizer_path is not None:
            if self.optimizer is None:
                raise RuntimeError("save_checkpoint: optimizer_path given but this policy has no optimizer")
            # A fresh model sharded state dict: saving one replaces its tensors.
            optimizer_checkpoint.save_optimizer(
                self.optimizer, self.scheduler, gpt.sharded_state_dict(), optimizer_path
            )
        if tokenizer_path is not None and self.rank == 0:
            self.tokenizer.save_pretrained(tokenizer_path)
        if save_hf_path is not None:
            full_state = mmodel.gather_hf_state_dict(self.model, self.shape, self.layers)
            if full_state is not None:
                save_consolidated_hf(
                    {name: tensor.float() for name, tensor in full_state.items()},
                    self.hf_config,
                    save_hf_path,
                    tokenizer=self.tokenizer,
                    save_format=save_hf_format,
                )
        dist.barrier()

    def load_checkpoint(self, weights_path: str, optimizer_path: str | None = None) -> None:
        """Load a `save_checkpoint` output, resharded to this run's parallel layout (a collective)."""
        gpt = mmodel.unwrap(self.model)
        loaded = dist_checkpointing.load(gpt.sharded_state_dict(), weights_path)
        gpt.load_state_dict(loaded, strict=False)
        if self.optimizer is None:
            return
        if optimizer_path is None:
            with megatron_cpu_shims.cuda_redirect():
                # The optimizer's fp32 main parameters (separate copies under bf16/fp16) take the loaded weights.
                self.optimizer.reload_model_params()
            return
        optimizer_checkpoint.load_optimizer(self.optimizer, self.scheduler, gpt.sharded_state_dict(), optimizer_path)

    def has_router_aux_loss(self) -> bool:
        """See `DTensorPolicyWorker.has_router_aux_loss`."""
        return moe.adds_load_balancing_loss(self.shape, self.cfg.megatron_cfg)

    def shutdown(self) -> bool:
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()
        return True
