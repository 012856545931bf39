"""What algorithms may ask of a training policy (docs/policy.md), independent of the backend that implements it.

Tensor conventions: ``input_ids`` ``[B, S]`` right-padded, ``input_lengths`` ``[B]``; logprobs are ``[B, S]`` fp32
with position ``i`` holding ``log p(token_i | tokens_<i)``, 0 at position 0 and on padding.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, TypedDict

import torch

from nemo_rl_clone.contract.loss import LossFunction
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.utils.timer import Timer


class LogprobOutputSpec(TypedDict):
    """`PolicyInterface.get_logprobs`' result: ``[B, S]`` fp32 (layout: the module's docstring)."""

    logprobs: torch.Tensor


class ReferenceLogprobOutputSpec(TypedDict):
    """`PolicyInterface.get_reference_policy_logprobs`' result: ``[B, S]`` fp32 under the initial weights."""

    reference_logprobs: torch.Tensor


class ScoreOutputSpec(TypedDict):
    """`PolicyInterface.score`'s result: ``[B]`` fp32 (a PPO critic's: ``[B, S]``)."""

    scores: torch.Tensor


class TopkLogitsOutputSpec(TypedDict):
    """`PolicyInterface.get_topk_logits`' result: ``[B, S, k]`` fp32 logits, largest first, and their int64 ids."""

    topk_logits: torch.Tensor
    topk_indices: torch.Tensor


class PolicyInterface(ABC):
    """A trainable language-model policy spread over workers, or a reward model (a scalar score head, trained
    through the same `train`; the logprob and refit methods then raise)."""

    @abstractmethod
    def get_logprobs(
        self, data: BatchedDataDict, timer: Timer | None = None, micro_batch_size: int | None = None
    ) -> BatchedDataDict:
        """``{"logprobs": [B, S]}`` of ``data["input_ids"]`` under the current weights; ``timer`` (NeMo-RL's) times
        the sharding and the workers' call (`Policy`)."""

    @abstractmethod
    def score(self, data: BatchedDataDict, micro_batch_size: int | None = None) -> BatchedDataDict:
        """A reward model's ``{"scores": [B] fp32}``: the score head at each row's last valid token
        (``input_lengths - 1``)."""

    @abstractmethod
    def get_reference_policy_logprobs(
        self, data: BatchedDataDict, micro_batch_size: int | None = None, timer: Timer | None = None
    ) -> BatchedDataDict:
        """``{"reference_logprobs": [B, S]}`` under the frozen initial weights."""

    def get_topk_logits(
        self, data: BatchedDataDict, k: int, micro_batch_size: int | None = None, timer: Timer | None = None
    ) -> BatchedDataDict:
        """``{"topk_logits": [B, S, k], "topk_indices": [B, S, k]}``: the ``k`` largest next-token logits at every
        position and their vocab ids (a distillation teacher's output); policies without it raise."""
        raise NotImplementedError(f"{type(self).__name__} does not provide get_topk_logits")

    @abstractmethod
    def train(
        self,
        data: BatchedDataDict,
        loss_fn: LossFunction,
        eval_mode: bool = False,
        *,
        gbs: int | None = None,
        mbs: int | None = None,
        timer: Timer | None = None,
    ) -> dict[str, Any]:
        """One optimizer step per global batch of ``gbs`` samples in ``data`` (none with ``eval_mode``).

        ``loss_fn`` receives next-token logits ``[B, S, V]``, or a reward model's scores ``[B, 1]``. Returns at
        least ``loss`` and ``grad_norm`` (``[num_global_batches]``) and ``all_mb_metrics`` (metric name → one value
        per microbatch of every data-parallel rank).
        """

    @abstractmethod
    def prepare_for_training(self) -> None: ...

    @abstractmethod
    def finish_training(self) -> None: ...

    @abstractmethod
    def prepare_for_lp_inference(self) -> None: ...

    @abstractmethod
    def save_checkpoint(
        self,
        weights_path: str,
        optimizer_path: str | None = None,
        tokenizer_path: str | None = None,
        checkpointing_cfg: Any = None,
        save_hf_path: str | None = None,
        save_hf_format: str = "safetensors",
    ) -> None: ...

    @abstractmethod
    def shutdown(self) -> bool: ...


class ColocatablePolicyInterface(PolicyInterface):
    """A policy that can share its devices with a generation engine and hand its weights to it (refit)."""

    @abstractmethod
    def offload_before_refit(self) -> None:
        """Free device memory the refit needs (optimizer state)."""

    @abstractmethod
    def offload_after_refit(self) -> None:
        """Free device memory for generation (weights) until the next ``prepare_for_*``."""

    @abstractmethod
    def prepare_refit_info(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        """``{hf_parameter_name: (full shape, dtype)}`` of the weights a refit transfers."""

    @abstractmethod
    def get_full_state_dict_for_refit(self) -> dict[str, torch.Tensor]:
        """The full Hugging Face-named state dict (CPU tensors, shapes and dtypes as in `prepare_refit_info`)."""
