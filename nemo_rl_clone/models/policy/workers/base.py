"""`PolicyWorkerBase`: what every policy worker does, whatever its backend; a backend supplies only what differs.

The shared sequence: join the process group and pick device and dtype; build the model; keep a CPU copy of the
initial weights for reference logprobs; build the optimizer and scheduler; resume from a checkpoint. ``train`` runs
one optimizer step per global batch (loss normalisation over the data-parallel ranks, the microbatches' loss shares
and metrics, the gradient norm, the step loss summed over ranks); ``get_logprobs`` and
``get_reference_policy_logprobs`` run the model over this rank's microbatches without gradients; ``save_checkpoint``
writes weights, optimizer, tokenizer and a consolidated Hugging Face folder.

A backend subclass supplies: ``_build`` (model, parallel layout, wrapping; sets ``model``, ``dp_size``,
``dp_group``), ``_build_optimizer``, ``_forward_backward`` (one global batch's loss calls and backward),
``_optimizer_step``, ``_zero_grad``, ``_advance_scheduler``, ``_inference_outputs`` (a forward pass per
microbatch), its checkpoint format (``_save_weights``, ``_save_optimizer``, ``_load_weights``, ``_load_optimizer``,
``_hf_export``) and the refit methods; the other ``_`` methods are hooks that do nothing unless overridden.

Gradient normalisation: a loss returns its microbatch's share of the *global* mean (divided by the valid tokens or
sequences of the whole global batch on all DP ranks), so the global gradient is the *sum* of the ranks' gradients;
each backend scales what it backpropagates so that its data-parallel averaging gives that sum.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import PretrainedConfig, PreTrainedTokenizerBase

from nemo_rl_clone.contract import sampling as sampling_processing
from nemo_rl_clone.contract.loss import LossFunction
from nemo_rl_clone.contract.sampling import TrainingSamplingParams
from nemo_rl_clone.data_plane.worker_mixin import TQWorkerMixin
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.models.hf_export import save_consolidated_hf
from nemo_rl_clone.models.policy.config import PolicyConfig
from nemo_rl_clone.models.policy.workers import reward_model, self_generation, topk_logits, train_step, worker_setup
from nemo_rl_clone.models.policy.workers.refit_sender import RefitSender
from nemo_rl_clone.models.policy.workers.train_profile import TrainProfile

# Runs the model on one microbatch and returns its output (next-token logits, or a reward model's scores); called
# only by a computation that needs the full output, so one that reads token logprobs some other way skips it.
Forward = Callable[[], torch.Tensor]
# One microbatch's result of an inference pass (concatenated over microbatches), from the microbatch and its forward.
MicrobatchCompute = Callable[[BatchedDataDict, Forward], torch.Tensor]
# One microbatch's (loss share as a CPU float64 scalar, metrics) of a training step.
LossShare = tuple[torch.Tensor, dict[str, Any]]


@dataclass(frozen=True)
class GlobalBatch:
    """One optimizer step's work as a backend's ``_forward_backward`` gets it."""

    microbatches: list[BatchedDataDict]
    loss_fn: LossFunction
    norm: train_step.StepNormalization  # what the loss calls divide by
    eval_mode: bool  # no backward
    profile: TrainProfile | None  # where the backend's forward and backward times go, when it profiles


def local_values(param: torch.Tensor) -> torch.Tensor:
    """This rank's values of a (possibly DTensor) parameter; in-place writes to it under no_grad update the
    parameter."""
    return param.to_local() if isinstance(param, DTensor) else param.data


def timed(profile: TrainProfile | None, field: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """`TrainProfile.timed` when the backend profiles its training, else nothing."""
    return profile.timed(field, device) if profile is not None else contextlib.nullcontext()


class PolicyWorkerBase(TQWorkerMixin, RefitSender):
    """One rank of the policy. Every public method except the ``prepare_*``/``offload_*`` ones is a collective.

    Args:
        config: the ``policy`` section.
        tokenizer: saved with checkpoints.
        model_path: a local Hugging Face folder or hub id (already resolved by the driver).
        weights_path / optimizer_path: checkpoints written by `save_checkpoint` to resume from (any parallel layout).
        init_optimizer: build the optimizer and scheduler (False for inference-only policies).
        init_reference_model: keep a frozen CPU copy of the initial (Hugging Face) weights for
            `get_reference_policy_logprobs`; it is taken before ``weights_path`` is loaded, so a resumed run keeps
            the original reference. A backend may need none (`_keeps_reference_weights`).
    """

    model: Any
    dp_size: int
    dp_group: Any
    optimizer: Any
    scheduler: Any
    is_reward_model: bool = False
    is_last_stage: bool = True  # of the pipeline: where the loss and the logits are (every rank without one)

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
        self._check_runtime_support()
        self.device = worker_setup.init_distributed()
        self.rank = dist.get_rank()
        self.dtype = worker_setup.PRECISION_DTYPES[config.precision]
        self._build(model_path)
        self.reference_weights: dict[str, torch.Tensor] | None = None
        if init_reference_model and self._keeps_reference_weights():
            # Kept in CPU memory and copied into the live weights only while reference logprobs are computed.
            self.reference_weights = {
                name: local_values(param).detach().to("cpu", copy=True) for name, param in self.model.named_parameters()
            }
        self.optimizer = None
        self.scheduler = None
        if init_optimizer:
            self.optimizer, self.scheduler = self._build_optimizer()
        if weights_path:
            self.load_checkpoint(weights_path, optimizer_path)

    # ------------------------------------------------------------------ what a backend supplies
    def _check_runtime_support(self) -> None:
        """Refuse options this machine cannot run, before joining the process group."""

    def _build(self, model_path: str) -> None:
        raise NotImplementedError

    def _build_optimizer(self) -> tuple[Any, Any]:
        raise NotImplementedError

    def _keeps_reference_weights(self) -> bool:
        return True

    def _forward_backward(self, step: GlobalBatch) -> list[LossShare]:
        """Call ``step.loss_fn`` on every microbatch (and backpropagate unless ``step.eval_mode``); their loss shares
        and metrics, in microbatch order (none on a rank without the loss)."""
        raise NotImplementedError

    def _zero_grad(self) -> None:
        raise NotImplementedError

    def _optimizer_step(self) -> torch.Tensor:
        """Clip, step (skipped on a non-finite gradient) and return the gradient norm before clipping."""
        raise NotImplementedError

    def _after_optimizer_step(self) -> None:
        pass

    def _advance_scheduler(self) -> None:
        raise NotImplementedError

    def _new_train_profile(self) -> TrainProfile | None:
        return None

    def _after_train(self, profile: TrainProfile | None) -> None:
        pass

    def _inference_outputs(
        self, data: BatchedDataDict, micro_batch_size: int, compute: MicrobatchCompute
    ) -> list[torch.Tensor]:
        """``compute`` of each microbatch of ``data`` (none on a rank without the logits); gradients are off."""
        raise NotImplementedError

    def _after_inference(self) -> None:
        pass

    def _microbatch_logprobs(
        self, microbatch: BatchedDataDict, forward: Forward, sampling: TrainingSamplingParams
    ) -> torch.Tensor:
        """``[b, s]`` logprobs of one microbatch (layout: `train_step.spec_logprobs`) under ``sampling``."""
        return train_step.spec_logprobs(
            forward(),
            microbatch["input_ids"],
            microbatch["input_lengths"],
            self.cfg.logprob_chunk_size,
            sampling=sampling,
            **self._vocab_parallel(),
        )

    def _vocab_parallel(self) -> dict[str, Any]:
        """`spec_logprobs`' vocab-parallel arguments when the logits are split over ranks."""
        return {}

    def _from_last_stage(self, value: Any) -> Any:
        """``value`` as computed on the last pipeline stage, on every stage."""
        return value

    def _reshard(self) -> None:
        """Drop weights gathered for a forward pass (sharded backends)."""

    def _move_model(self, device: torch.device) -> None:
        pass

    def _move_optimizer_state(self, device: torch.device) -> None:
        pass

    def _free_cached_memory(self) -> None:
        pass

    def _destroy_parallel_state(self) -> None:
        pass

    # ------------------------------------------------------------------ logprobs
    def _require_language_model(self, method: str) -> None:
        if self.is_reward_model:
            raise reward_model.reward_model_error(method)

    def _inference_pass(
        self, data: BatchedDataDict, micro_batch_size: int | None, compute: MicrobatchCompute
    ) -> torch.Tensor:
        """``compute`` over this rank's shard, concatenated over microbatches, without gradients."""
        train_step.require_keys(data, ("input_ids", "input_lengths"))
        self.model.eval()
        with torch.no_grad():
            outputs = self._inference_outputs(data, micro_batch_size or self.cfg.logprob_batch_size, compute)
        result = self._from_last_stage(torch.cat(outputs) if self.is_last_stage else None)
        self._after_inference()
        return result

    def get_logprobs(
        self, data: BatchedDataDict, micro_batch_size: int | None = None, filtered: bool = True
    ) -> BatchedDataDict:
        """``{"logprobs": [B, S] fp32}`` of this rank's shard (layout: `train_step.spec_logprobs`), under the
        sampler's processing (``policy.generation``'s temperature, and its top-k/top-p unless ``filtered`` is
        false)."""
        self._require_language_model("get_logprobs")
        sampling = self.sampling if filtered else self.sampling.unfiltered()

        def logprobs(microbatch: BatchedDataDict, forward: Forward) -> torch.Tensor:
            lp = self._microbatch_logprobs(microbatch, forward, sampling)
            return train_step.pad_to_width(lp, data["input_ids"].shape[1]).cpu()

        return BatchedDataDict({"logprobs": self._inference_pass(data, micro_batch_size, logprobs)})

    def generate(
        self, data: BatchedDataDict, micro_batch_size: int | None = None, greedy: bool = False
    ) -> BatchedDataDict:
        """Samples for this rank's shard with the policy's own model (`self_generation`)."""
        self._require_language_model("generate")
        return self_generation.generate(self, data, micro_batch_size, greedy)

    def get_topk_logits(self, data: BatchedDataDict, k: int, micro_batch_size: int | None = None) -> BatchedDataDict:
        """``{"topk_logits": [B, S, k] fp32, "topk_indices": [B, S, k] int64}`` of this rank's shard (layout:
        `topk_logits`), the logits divided by ``policy.generation.temperature``."""
        self._require_language_model("get_topk_logits")
        topk_logits.check_k(k)
        width = data["input_ids"].shape[1]

        def topk(batch: BatchedDataDict, forward: Forward) -> torch.Tensor:
            logits = sampling_processing.scale(self._whole_vocabulary(forward()), self.sampling)
            values, ids = topk_logits.topk_of_logits(logits, k, batch["input_lengths"], width)
            # One float64 tensor (exact for fp32 values and vocab ids) that the last pipeline stage hands on.
            return torch.stack([values.double(), ids.double()], dim=-1)

        both = self._inference_pass(data, micro_batch_size, topk)
        return BatchedDataDict({"topk_logits": both[..., 0].float(), "topk_indices": both[..., 1].long()})

    def _whole_vocabulary(self, logits: torch.Tensor) -> torch.Tensor:
        """The model's logits over the whole vocabulary (a backend whose head splits it gathers them here)."""
        return logits

    @torch.no_grad()
    def get_reference_policy_logprobs(
        self, data: BatchedDataDict, micro_batch_size: int | None = None
    ) -> BatchedDataDict:
        """``{"reference_logprobs": [B, S]}``: `get_logprobs` under the frozen initial weights (with LoRA: the base
        model's), temperature-scaled but not top-k/top-p filtered (the KL term's distribution)."""
        self._require_language_model("get_reference_policy_logprobs")
        with self._reference_model():
            logprobs = self.get_logprobs(data, micro_batch_size, filtered=False)["logprobs"]
        return BatchedDataDict({"reference_logprobs": logprobs})

    @contextlib.contextmanager
    def _reference_model(self) -> Iterator[None]:
        """The initial weights in place of the live ones inside the block."""
        if self.reference_weights is None:
            raise RuntimeError("this policy was created with init_reference_model=False; it has no reference model")
        params = dict(self.model.named_parameters())
        self._reshard()
        with torch.no_grad():
            current = {name: local_values(param).detach().to("cpu", copy=True) for name, param in params.items()}
            for name, param in params.items():
                local_values(param).copy_(self.reference_weights[name])
            try:
                yield
            finally:
                self._reshard()  # drop anything gathered from the reference weights
                for name, param in params.items():
                    local_values(param).copy_(current[name])

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
        """Optimizer steps over this rank's shard: one per global batch of ``gbs`` samples (``gbs // dp`` here).
        ``loss_normalization``: the whole global batches' counts when `Policy.train` left rows out (`trained_rows`).

        Returns (identical on every rank of a DP group and every pipeline stage, except ``all_mb_metrics``, which
        holds this rank's microbatches): ``global_loss`` ``[num_global_batches]`` (the global mean loss of each
        step), ``grad_norm`` ``[num_global_batches]`` (before clipping; 0 in eval mode), ``all_mb_metrics`` (metric
        → list, one entry per microbatch, plus ``lr``, ``global_valid_seqs``, ``global_valid_toks``) and, where the
        backend profiles its training, ``profile``.
        """
        if self.optimizer is None and not eval_mode:
            raise RuntimeError("this policy was created with init_optimizer=False; it cannot train")
        gbs = gbs or self.cfg.train_global_batch_size
        mbs = mbs or self.cfg.train_micro_batch_size
        local_gbs = gbs // self.dp_size
        self.model.train(not eval_mode)
        losses, grad_norms = [], []
        all_mb_metrics: dict[str, list[Any]] = defaultdict(list)
        profile = self._new_train_profile()
        with torch.set_grad_enabled(not eval_mode):
            for index in range(data.size // local_gbs):
                batch = data.get_batch(index, local_gbs)
                norm = train_step.global_batch_normalization(batch, self.dp_group, loss_normalization, index, loss_fn)
                step_loss, grad_norm, step_metrics = self._train_step(batch, mbs, loss_fn, norm, eval_mode, profile)
                losses.append(step_loss)
                grad_norms.append(grad_norm)
                for key, values in step_metrics.items():
                    all_mb_metrics[key].extend(values)
        if not eval_mode and self.scheduler is not None:
            self._advance_scheduler()
        self._after_train(profile)
        return {
            "global_loss": torch.stack(losses) if losses else torch.zeros(0),
            "grad_norm": torch.stack(grad_norms).float().cpu() if grad_norms else torch.zeros(0),
            "all_mb_metrics": dict(all_mb_metrics),
            **({"profile": profile} if profile is not None else {}),
        }

    def _train_step(
        self,
        batch: BatchedDataDict,
        mbs: int,
        loss_fn: LossFunction,
        norm: train_step.StepNormalization,
        eval_mode: bool,
        profile: TrainProfile | None,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, list[Any]]]:
        """One global batch: (the step's global loss, the gradient norm, metric → one value per microbatch)."""
        microbatches = list(train_step.microbatches(batch, mbs))
        if not eval_mode:
            self._zero_grad()
        shares = self._forward_backward(GlobalBatch(microbatches, loss_fn, norm, eval_mode, profile))
        step_loss = torch.zeros((), dtype=torch.float64)
        step_metrics: dict[str, list[Any]] = defaultdict(list)
        for loss_share, metrics in shares:
            step_loss += loss_share
            for key, value in {**metrics, "lr": self._lr(), **norm.reported_counts()}.items():
                step_metrics[key].append(value)
        with timed(profile, "optimizer_s", self.device):
            grad_norm = self._optimizer_step() if not eval_mode else torch.tensor(0.0)
        if not eval_mode:
            self._after_optimizer_step()
        if self.is_last_stage:
            dist.all_reduce(step_loss, group=self.dp_group)
        step_loss, metrics_by_key = self._from_last_stage((step_loss, dict(step_metrics)))
        return step_loss.float(), grad_norm, metrics_by_key

    def _lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"] if self.optimizer is not None else 0.0

    # ------------------------------------------------------------------ placement
    def prepare_for_training(self) -> None:
        self._move_model(self.device)
        self._move_optimizer_state(self.device)
        self.model.train()

    def prepare_for_lp_inference(self) -> None:
        self._move_model(self.device)
        if self.cfg.offload_optimizer_for_logprob:  # a logprob pass needs no optimizer state: free its memory
            self._move_optimizer_state(torch.device("cpu"))
        self.model.eval()

    def finish_training(self) -> None:
        """Nothing to release: the weights stay where they are until `offload_after_refit`."""

    def offload_before_refit(self) -> None:
        """Free accelerator memory for the refit (optimizer state to CPU where the backend moves it)."""
        self._move_optimizer_state(torch.device("cpu"))
        self._free_cached_memory()

    def offload_after_refit(self) -> None:
        """Free accelerator memory for colocated generation (the model to CPU where the backend moves it, until the
        next ``prepare_for_*``)."""
        self._move_model(torch.device("cpu"))
        self._free_cached_memory()

    # ------------------------------------------------------------------ weights for refit and checkpoints
    def prepare_refit_info(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        """``{hf_name: (full shape, dtype)}`` of what `get_full_state_dict_for_refit` returns (no collective)."""
        raise NotImplementedError

    def save_checkpoint(
        self,
        weights_path: str,
        optimizer_path: str | None = None,
        tokenizer_path: str | None = None,
        save_hf_path: str | None = None,
        save_hf_format: str = "safetensors",
    ) -> None:
        """The model in the backend's distributed checkpoint format (reloads at any parallel layout) and, with
        ``optimizer_path``, the optimizer and scheduler; ``tokenizer.save_pretrained(tokenizer_path)``; a
        consolidated Hugging Face folder at ``save_hf_path`` (``save_hf_format`` as `save_consolidated_hf`'s
        ``save_format``). A collective."""
        self._save_weights(weights_path)
        if optimizer_path is not None:
            if self.optimizer is None:
                raise RuntimeError("save_checkpoint: optimizer_path given but this policy has no optimizer")
            self._save_optimizer(optimizer_path)
        if tokenizer_path is not None and self.rank == 0:
            self.tokenizer.save_pretrained(tokenizer_path)
        if save_hf_path is not None:
            export = self._hf_export()
            if export is not None:
                state, hf_config, model_class = export
                save_consolidated_hf(
                    state,
                    hf_config,
                    save_hf_path,
                    tokenizer=self.tokenizer,
                    model_class=model_class,
                    save_format=save_hf_format,
                )
        dist.barrier()

    def load_checkpoint(self, weights_path: str, optimizer_path: str | None = None) -> None:
        """Load a `save_checkpoint` output, resharded to this run's parallel layout (a collective)."""
        self._load_weights(weights_path)
        if self.optimizer is not None:
            self._load_optimizer(optimizer_path)

    def _save_weights(self, path: str) -> None:
        raise NotImplementedError

    def _save_optimizer(self, path: str) -> None:
        raise NotImplementedError

    def _load_weights(self, path: str) -> None:
        raise NotImplementedError

    def _load_optimizer(self, path: str | None) -> None:
        """Optimizer and scheduler from ``path`` (None: none saved; the weights were loaded without them)."""
        raise NotImplementedError

    def _hf_export(self) -> tuple[dict[str, torch.Tensor], PretrainedConfig, Any] | None:
        """(full state dict, Hugging Face config, ``Auto*`` model class) of a consolidated export, on rank 0; None
        on the other ranks. A collective."""
        raise NotImplementedError

    def has_router_aux_loss(self) -> bool:
        """Whether training adds a router load-balancing loss (an MoE model, coefficient > 0): it depends on every
        row that runs, so `Policy.train` then leaves no row out (`trained_rows`)."""
        raise NotImplementedError

    def shutdown(self) -> bool:
        self._destroy_parallel_state()
        if dist.is_initialized():
            dist.destroy_process_group()
        return True
