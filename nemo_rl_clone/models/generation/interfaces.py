"""What algorithms may ask of a generation backend (docs/generation_and_refit.md), independent of the engine behind it.

Batch formats (`BatchedDataDict`):

- input of `GenerationInterface.generate`: ``input_ids`` ``[B, S]`` int (right-padded), ``input_lengths`` ``[B]``;
  optional ``stop_strings`` (list of ``B`` lists of strings or None, added to ``policy.generation.stop_strings``)
  and ``seeds`` (``[B]`` ints: per-sample sampling seeds, reproducible whichever engine serves the sample);
- output: ``output_ids`` ``[B, W]`` (prompt + generation, right-padded with the pad token), ``logprobs`` ``[B, W]``
  fp32 (the engine's logprob of each generated token at its position, 0 on prompt and padding),
  ``generation_lengths`` and ``unpadded_sequence_lengths`` ``[B]``, ``truncated`` ``[B]`` bool (stopped by the token
  limit). ``W >= S``. An engine that records routing (MoE router replay) adds ``routed_experts``
  ``[B, W, layers, k]`` int16: the experts each position's token was routed to, -1 where none (`data.interfaces.pad_routing`).

Refit: the algorithm (``rollout/refit.py``) moves weights from a policy to a generation backend through
`prepare_refit_info`, `update_weights_from_state_dict` (colocated) or `init_collective` +
`update_weights_from_collective` (non-colocated). Policy and generation never import each other.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import ray
import torch

from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.distributed.weight_transfer import DEFAULT_BUCKET_BYTES, PackedTensors
from nemo_rl_clone.models.generation.config_types import (  # NeMo-RL's names at its path
    ColocationConfig,
    GenerationConfig,
    GenerationDatumSpec,
    GenerationOutputSpec,
    OptionalResourcesConfig,
    ResourcesConfig,
)
from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.utils.unsupported_modules import UnsupportedFeatureError

__all__ = [
    "GENERATION_INPUT_KEYS",
    "ColocationConfig",
    "GenerationConfig",
    "GenerationDatumSpec",
    "GenerationInterface",
    "GenerationOutputSpec",
    "OptionalResourcesConfig",
    "RefitError",
    "ResourcesConfig",
    "check_generation_input",
    "check_one_train_rank",
    "verify_right_padding",
]

GENERATION_INPUT_KEYS = ("input_ids", "input_lengths")


class RefitError(RuntimeError):
    """A weight update was refused or failed before loading anything: the engines still serve the old weights."""


class GenerationInterface(ABC):
    """A text generation backend spread over workers (one engine per data-parallel rank)."""

    dp_size: int  # number of engines (data-parallel ranks)

    @abstractmethod
    def generate(self, data: BatchedDataDict, greedy: bool = False) -> BatchedDataDict:
        """Generate a continuation for every row (formats in the module docstring)."""

    @abstractmethod
    def generate_text(self, data: BatchedDataDict, greedy: bool = False) -> BatchedDataDict:
        """``{"texts": [str]}``: continuations of ``data["prompts"]`` (raw strings), for evaluation."""

    def take_performance_metrics(self) -> dict[str, float]:
        """Throughput of the generation since the last call, then reset: ``prefill_tokens_per_sec`` and
        ``decode_tokens_per_sec`` where the backend can tell them apart; {} otherwise."""
        return {}

    @abstractmethod
    def prepare_for_generation(self, tags: list[str] | None = None) -> None:
        """Re-acquire memory released by `finish_generation` (``tags``: ``["weights"]``, ``["kv_cache"]``, all)."""

    @abstractmethod
    def finish_generation(self) -> None:
        """Release memory so a colocated trainer can use the devices."""

    @abstractmethod
    def prepare_refit_info(self, state_dict_info: Mapping[str, tuple[torch.Size, torch.dtype]]) -> None:
        """Tell the engines what a refit will send (``{name: (shape, dtype)}`` from the policy)."""

    @abstractmethod
    def update_weights_from_state_dict(
        self, state_dict: Mapping[str, torch.Tensor] | PackedTensors | ray.ObjectRef
    ) -> None:
        """Load a full Hugging Face-named state dict (plain, packed, or an ObjectRef of either) on every engine
        (colocated refit); raises `RefitError`, old weights kept, when it does not fit."""

    @abstractmethod
    def init_collective(self, ip: str, port: int, world_size: int, *, timeout_s: float = 300.0) -> list[ray.ObjectRef]:
        """Join the weight-transfer group at ``ip:port`` whose rank 0 is train rank 0 (non-colocated refit); returns
        the engines' futures, to be awaited together with the trainer's."""

    @abstractmethod
    def update_weights_from_collective(self, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[ray.ObjectRef]:
        """Receive and load the weights broadcast by train rank 0; futures as in `init_collective`."""

    @abstractmethod
    def invalidate_kv_cache(self) -> None:
        """Drop cached KV/prefix blocks (they were computed with the old weights)."""

    @property
    def requires_kv_scale_sync(self) -> bool:
        """NeMo-RL's: whether a refit must also send FP8 KV-cache scales; never here (no FP8 KV cache)."""
        return False

    def update_weights_via_ipc_zmq(self) -> list[ray.ObjectRef]:
        """NeMo-RL's CUDA-IPC refit over ZMQ is not built: colocated refit is `update_weights_from_state_dict`."""
        raise UnsupportedFeatureError(
            f"{type(self).__name__}.update_weights_via_ipc_zmq: not supported yet: CUDA-IPC weight transfer over ZMQ "
            "(colocated refit goes through update_weights_from_state_dict)"
        )

    def get_logger_metrics(self) -> dict[str, Any]:
        """NeMo-RL's vLLM logger gauges: {}, none are collected here (``vllm_cfg.enable_vllm_metrics_logger`` logs
        nothing); generation throughput comes from `take_performance_metrics`."""
        return {}

    def clear_logger_metrics(self) -> None:  # noqa: B027 (NeMo-RL's optional hook, not abstract)
        """NeMo-RL's reset of the gauges `get_logger_metrics` reports; none are collected here, so nothing to reset."""

    @abstractmethod
    def shutdown(self) -> bool:
        """Stop the engines and remove the files they leave; idempotent."""


def verify_right_padding(
    data: BatchedDataDict[Any], pad_value: int = 0, raise_error: bool = True
) -> tuple[bool, str | None]:
    """NeMo-RL's check that a generation batch is right-padded: every position at or past a row's length holds
    ``pad_value``. Reads ``input_ids`` with ``input_lengths`` (an input batch) or else ``output_ids`` with
    ``unpadded_sequence_lengths`` (an output batch). Returns ``(True, None)``, or ``(False, the first problem)``
    when ``raise_error`` is False; otherwise the problem is raised as ValueError."""
    if not isinstance(data, BatchedDataDict):
        raise TypeError(f"verify_right_padding: data must be a BatchedDataDict, got {type(data).__name__}")
    if pad_value is None:
        raise ValueError("verify_right_padding: pad_value is None (the tokenizer has no pad_token_id)")
    problem = _right_padding_problem(data, pad_value)
    if problem is not None and raise_error:
        raise ValueError(problem)
    return problem is None, problem


def _right_padding_problem(data: BatchedDataDict[Any], pad_value: int) -> str | None:
    for tokens_key, lengths_key in (("input_ids", "input_lengths"), ("output_ids", "unpadded_sequence_lengths")):
        if tokens_key in data and lengths_key in data:
            tokens, lengths = data[tokens_key], data[lengths_key]
            break
    else:
        return (
            "expected the keys (input_ids, input_lengths) or (output_ids, unpadded_sequence_lengths); "
            f"got {sorted(data)}"
        )
    if tokens.ndim != 2:
        return f"{tokens_key} must be 2-D [batch, sequence], got shape {tuple(tokens.shape)}"
    if lengths.shape[0] != tokens.shape[0]:
        return f"{tokens_key} has {tokens.shape[0]} rows but {lengths_key} has {lengths.shape[0]}"
    width = tokens.shape[1]
    past_end = torch.arange(width, device=tokens.device)[None, :] >= lengths.to(tokens.device)[:, None]
    not_padding = past_end & (tokens != pad_value)
    for row, length in enumerate(lengths.tolist()):
        if length > width:
            return f"{lengths_key}[{row}] = {length} exceeds the sequence width {width}"
        if not_padding[row].any():
            positions = torch.nonzero(not_padding[row]).flatten().tolist()
            return (
                f"row {row}: values other than the pad value {pad_value} after length {length}: positions {positions}"
            )
    return None


def check_one_train_rank(train_world_size: int) -> None:
    """NeMo-RL's ``train_world_size``: the train ranks in the weight-transfer group. Here train rank 0 alone sends
    the weights (``world_size`` = 1 + the engines), so any other count is refused."""
    if train_world_size != 1:
        raise UserInputError(
            f"init_collective: train_world_size={train_world_size}: not supported yet: every train rank in the "
            "weight-transfer group (train rank 0 alone broadcasts here; pass 1)"
        )


def check_generation_input(data: Any, max_model_len: int, method: str = "generate") -> None:
    """Raise one clear error for a malformed generation batch (naming the key or row)."""
    if not isinstance(data, BatchedDataDict):
        raise TypeError(f"{method}: data must be a BatchedDataDict, got {type(data).__name__}")
    missing = [key for key in GENERATION_INPUT_KEYS if key not in data]
    if missing:
        raise KeyError(f"{method}: data is missing {missing}; it has {sorted(data)}")
    input_ids, lengths = data["input_ids"], data["input_lengths"]
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or input_ids.is_floating_point():
        raise ValueError(f"{method}: input_ids must be an integer tensor [B, S], got {_describe(input_ids)}")
    if not isinstance(lengths, torch.Tensor) or lengths.ndim != 1 or lengths.is_floating_point():
        raise ValueError(f"{method}: input_lengths must be an integer tensor [B], got {_describe(lengths)}")
    for row, length in enumerate(lengths.tolist()):
        if not 1 <= length <= input_ids.shape[1]:
            raise ValueError(
                f"{method}: input_lengths[{row}] = {length} must be in [1, {input_ids.shape[1]}] (the padded width)"
            )
        if length >= max_model_len:
            raise ValueError(
                f"{method}: row {row} has a {length}-token prompt, which leaves no room to generate under "
                f"policy.generation.vllm_cfg.max_model_len = {max_model_len}"
            )
    check_per_sample_options(data, method)


def check_per_sample_options(data: BatchedDataDict, method: str) -> None:
    stop_strings = data.get("stop_strings")
    if stop_strings is not None:
        for row, stops in enumerate(stop_strings):
            if stops is not None and (
                not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops)
            ):
                raise ValueError(
                    f"{method}: stop_strings[{row}] must be None or a list of non-empty strings, got {stops!r}"
                )
    seeds = data.get("seeds")
    if seeds is not None and isinstance(seeds, torch.Tensor) and seeds.is_floating_point():
        raise ValueError(f"{method}: seeds must be integers, got a {seeds.dtype} tensor")


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__
