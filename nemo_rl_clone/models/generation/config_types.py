"""NeMo-RL v0.7.0's TypedDicts of generation configs and batches (``nemo_rl.models.generation.interfaces``),
presented there by `interfaces`: the dict shapes NeMo-RL's scripts build and read by key.

They only type dicts: a ``policy.generation`` section is validated as this library's
`nemo_rl_clone.models.generation.config.GenerationConfig` where it is used, which names each unknown or refused key
in one line; the batches are checked by `interfaces.check_generation_input` and `interfaces.verify_right_padding`.
Kept free of torch and Ray so that configs type-check without loading them; not ``from __future__ import
annotations``: a TypedDict reads ``NotRequired`` from evaluated annotations.
"""

from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

if TYPE_CHECKING:
    import torch


class ResourcesConfig(TypedDict):
    gpus_per_node: int
    num_nodes: int


class OptionalResourcesConfig(TypedDict):
    """`ResourcesConfig` whose sizes may be null (the colocated section's: filled in at setup)."""

    gpus_per_node: int | None
    num_nodes: int | None


class ColocationConfig(TypedDict):
    enabled: bool
    resources: OptionalResourcesConfig


class GenerationConfig(TypedDict):
    """The ``policy.generation`` section; ``_pad_token_id`` and ``_mtp_weights_from_refit`` are written by
    `configure_generation_config`, not by users."""

    backend: str
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int | None
    model_name: NotRequired[str]
    stop_token_ids: list[int] | None
    stop_strings: list[str] | None
    colocated: NotRequired[ColocationConfig]
    port_range_low: NotRequired[int]
    port_range_high: NotRequired[int]
    use_async_rollouts: NotRequired[bool]
    _pad_token_id: NotRequired[int]
    _mtp_weights_from_refit: NotRequired[bool]


class GenerationDatumSpec(TypedDict):
    """A generation input batch: ``input_ids`` [B, S] right-padded, ``input_lengths`` [B], optional per-sample
    ``stop_strings``; other keys pass through."""

    input_ids: "torch.Tensor"
    input_lengths: "torch.Tensor"
    stop_strings: NotRequired[list[str]]
    __extra__: Any


class GenerationOutputSpec(TypedDict):
    """A generation output batch: ``output_ids`` [B, W] (prompt + generation, right-padded), ``generation_lengths``
    and ``unpadded_sequence_lengths`` [B], ``logprobs`` [B, W] (0 on prompt and padding), optional ``truncated`` [B]
    and the routing record of MoE router replay."""

    output_ids: "torch.Tensor"
    generation_lengths: "torch.Tensor"
    unpadded_sequence_lengths: "torch.Tensor"
    logprobs: "torch.Tensor"
    routed_experts: NotRequired["torch.Tensor"]
    r3_routed_experts_missing_routes: NotRequired["torch.Tensor"]
    r3_routed_experts_expected_routes: NotRequired["torch.Tensor"]
    r3_routed_experts_actual_routes: NotRequired["torch.Tensor"]
    truncated: NotRequired["torch.Tensor"]
    __extra__: Any
