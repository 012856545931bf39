"""Mixture-of-experts causal LMs on the DTensor backend (Hugging Face Qwen3-MoE, Mixtral, ...).

The MoE layers train as they are (FSDP2 shards the fused expert tensors like any other parameter). What this module
adds is router replay (`RoutingReplay`) and the routers' load-balancing loss: a Hugging Face MoE model computes it only when called with
``output_router_logits`` and adds it to the loss only when given ``labels``, which this trainer never passes (its
losses read logits or token logprobs). `RouterAuxLoss` asks for the routers' logits during training, computes the
model's own Switch-Transformer loss over the valid tokens, logs it as ``router_aux_loss`` and adds
``router_aux_loss_coef`` × it to the loss. The coefficient is the model config's (``policy.hf_config_overrides.
router_aux_loss_coef`` sets it; Qwen3-MoE's default is 0.001, NeMo-RL's MoE recipes set 0.0).
"""

from __future__ import annotations

import functools
from typing import Any, cast

import torch

from nemo_rl_clone.utils.errors import UserInputError

# Config attributes that hold the number of routed experts, by model family.
_EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def num_routed_experts(hf_config: Any) -> int:
    """How many routed experts each MoE layer of the model has; 0 for a dense model."""
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    return max((int(getattr(text, key, 0) or 0) for key in _EXPERT_COUNT_KEYS), default=0)


def refusal(hf_config: Any, tensor_parallel_size: int, context_parallel_size: int) -> str | None:
    """Why this backend cannot train the model with these parallel sizes, or None."""
    if not num_routed_experts(hf_config):
        return None
    if tensor_parallel_size > 1:
        return (
            "policy.dtensor_cfg.tensor_parallel_size > 1 with an MoE model: the experts' tensor-parallel plan is not "
            "built in the DTensor backend; use 1 (FSDP2 shards the experts) or the Megatron backend"
        )
    if context_parallel_size > 1:
        return (
            "policy.dtensor_cfg.context_parallel_size > 1 with an MoE model: the router loss would see one shard "
            "of each sequence; use 1"
        )
    return None


class RouterAuxLoss:
    """The load-balancing loss of one forward's routers, for a model with routed experts."""

    def __init__(self, hf_config: Any) -> None:
        text = hf_config.get_text_config()
        self.num_experts = num_routed_experts(hf_config)
        self.top_k = int(text.num_experts_per_tok)
        self.coef = float(getattr(text, "router_aux_loss_coef", 0.0) or 0.0)

    @staticmethod
    def model_kwargs() -> dict[str, Any]:
        """What the training forward passes to the model so that its output carries ``router_logits``."""
        return {"output_router_logits": True}

    def __call__(self, router_logits: tuple[torch.Tensor, ...], valid: torch.Tensor | None) -> torch.Tensor:
        """Scalar fp32 loss from each MoE layer's ``[tokens, experts]`` router logits (the tokens of the rows the
        model ran, flattened); ``valid`` ``[rows, width]`` marks the real tokens (None: all are)."""
        from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

        # The same function in every Hugging Face MoE model that has one (Mixtral's, Qwen2-MoE's, ...).
        loss = load_balancing_loss_func(cast(Any, tuple(router_logits)), self.num_experts, self.top_k, valid)
        return torch.as_tensor(loss, dtype=torch.float32)

    def add_to(
        self,
        loss: torch.Tensor,
        metrics: dict[str, Any],
        router_logits: tuple[torch.Tensor, ...],
        input_lengths: torch.Tensor | None,
        share: float,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """A microbatch's loss and metrics with its ``share`` of the step's mean router loss added (1 / the step's
        microbatches over all data-parallel ranks, as every metric here is a share that the step sums).
        ``input_lengths`` ``[rows]``: the valid tokens of right-padded rows; None when every token the model ran is
        valid (packed rows)."""
        valid = None
        if input_lengths is not None:
            width = len(router_logits[0]) // len(input_lengths)
            positions = torch.arange(width, device=router_logits[0].device)
            valid = positions < input_lengths.to(positions.device)[:, None]
        aux = self(router_logits, valid) * share
        return loss + self.coef * aux.to(loss.dtype), {**metrics, "router_aux_loss": aux.item()}


class RoutingReplay:
    """``policy.router_replay``: each token goes to the experts the generation engine routed it to.

    A forward hook on every Hugging Face MoE router (a ``*TopKRouter``, which returns its logits, the top-k weights
    and the top-k expert ids) replaces the ids with the recorded ones where the batch has a record, and the weights
    with the router's own probabilities of those experts, renormalised as the model does (``norm_topk_prob``;
    Mixtral always), so the router keeps its gradient. Positions without a record (-1) keep the model's routing."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.routers = [module for module in model.modules() if type(module).__name__.endswith("TopKRouter")]
        if not self.routers:
            raise UserInputError(
                "policy.router_replay.enabled: the model has no Hugging Face MoE router (a *TopKRouter module) to "
                "replay; router replay is for MoE models"
            )
        self.routing: torch.Tensor | None = None  # [tokens, layers, k] of the forward about to run
        for layer, router in enumerate(self.routers):
            router.register_forward_hook(functools.partial(self._replay, layer))

    def _replay(self, layer: int, module: torch.nn.Module, args: Any, output: Any) -> Any:
        if self.routing is None:
            return output
        logits, weights, indices = output
        recorded = self.routing[:, layer].to(indices.device, torch.long)
        if recorded.shape != indices.shape:
            raise RuntimeError(
                f"router replay: layer {layer} routes {tuple(indices.shape)} (tokens, k), the record holds "
                f"{tuple(recorded.shape)}"
            )
        chosen = torch.where(recorded >= 0, recorded, indices)
        top = torch.softmax(logits, dim=-1, dtype=torch.float).gather(-1, chosen)
        if getattr(module, "norm_topk_prob", True):
            top = top / top.sum(dim=-1, keepdim=True)
        return logits, top.to(weights.dtype), chosen
