"""FSDP2 + DTensor tensor parallelism for Hugging Face causal LMs, and the helpers that must know about both.

Layout: a 3-D device mesh ``("dp", "cp", "tp")``. Tensor parallelism (``parallelize_module``) shards the attention and
MLP projections of every decoder layer over ``tp``; context parallelism (`context_parallel`) splits each sequence over
``cp`` (its ranks hold the same replica); FSDP2 (``fully_shard``) then shards every parameter over ``dp x cp``, one
FSDP group per decoder layer plus the root (embeddings, final norm, head). Embeddings and the LM head stay
replicated over ``tp`` (tied embeddings make a vocab-parallel head awkward), so the logits are a plain tensor.
Expert parallelism (MoE models, no TP/CP) adds a second mesh over the same ranks, ``("edp", "ep")``: see
`expert_parallel`.
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from transformers import PreTrainedModel

from nemo_rl_clone.models.policy.dtensor import expert_parallel
from nemo_rl_clone.models.policy.workers.optim import import_by_path

# Hugging Face's `base_model_tp_plan` vocabulary → DTensor styles. Other entries (e.g. Qwen3's
# "replicated_with_grad_allreduce" q/k norms over head_dim) need nothing: those parameters stay replicated.
_HF_STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}


def build_device_mesh(
    device: torch.device, tensor_parallel_size: int, context_parallel_size: int = 1, dp_replicate_size: int = 1
) -> DeviceMesh:
    """A ``("dp", "cp", "tp")`` mesh over the whole world; ranks are laid out dp-major (the cp x tp ranks of one
    replica are neighbours). With ``dp_replicate_size`` r > 1 (HSDP; validation: no context or expert parallelism)
    ``dp`` is itself ``("dp_replicate", "dp_shard")`` flattened: r groups of ``dp / r`` ranks, each group holding
    one whole sharded copy of the model."""
    world_size = dist.get_world_size()
    replica = tensor_parallel_size * context_parallel_size
    if tensor_parallel_size < 1 or context_parallel_size < 1 or world_size % replica:
        raise ValueError(
            f"policy.dtensor_cfg.tensor_parallel_size={tensor_parallel_size} x context_parallel_size="
            f"{context_parallel_size} must divide the number of workers ({world_size})"
        )
    dp_size = world_size // replica
    if dp_replicate_size == 1:
        return init_device_mesh(
            device.type, (dp_size, context_parallel_size, tensor_parallel_size), mesh_dim_names=("dp", "cp", "tp")
        )
    if dp_size % dp_replicate_size:
        raise ValueError(
            f"policy.dtensor_cfg.dp_replicate_size={dp_replicate_size} must divide the data-parallel size ({dp_size})"
        )
    mesh = init_device_mesh(
        device.type,
        (dp_replicate_size, dp_size // dp_replicate_size, context_parallel_size, tensor_parallel_size),
        mesh_dim_names=("dp_replicate", "dp_shard", "cp", "tp"),
    )
    mesh["dp_replicate", "dp_shard"]._flatten("dp")  # data sharding and loss scaling see one dp of r x s ranks
    return mesh


def fsdp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The mesh FSDP shards over and reduces gradients across: ``dp``, or ``dp x cp`` flattened (cp ranks compute
    gradients of different tokens of the same replica), or for HSDP the 2-D ``("dp_replicate", "dp_shard")`` (FSDP2
    shards over the second dimension and all-reduces gradients over the first)."""
    if "dp_replicate" in (mesh.mesh_dim_names or ()):
        return mesh["dp_replicate", "dp_shard"]
    return mesh["dp"] if mesh["cp"].size() == 1 else mesh["dp", "cp"]._flatten("dp_cp")


def tensor_parallel_plan(model: nn.Module, custom_parallel_plan: str | None = None) -> dict[str, ParallelStyle]:
    """Module-path → style plan for ``parallelize_module``.

    ``custom_parallel_plan`` is a dotted path to such a dict, or to a callable ``(model) -> dict``. Otherwise the
    plan comes from the model's Hugging Face ``config.base_model_tp_plan`` (column-wise q/k/v and gate/up, row-wise
    o and down), rooted at the base model (``model.model.layers.*...``).
    """
    if custom_parallel_plan:
        plan = import_by_path(custom_parallel_plan, "policy.dtensor_cfg.custom_parallel_plan")
        plan = plan(model) if callable(plan) else plan
        if not isinstance(plan, Mapping):
            raise ValueError(
                f"policy.dtensor_cfg.custom_parallel_plan: {custom_parallel_plan!r} must be a dict or a callable "
                f"returning a dict of module path -> ParallelStyle, got {type(plan).__name__}"
            )
        return dict(plan)
    hf_plan = getattr(model.config, "base_model_tp_plan", None)
    if not hf_plan:
        raise ValueError(
            f"{type(model).__name__} has no Hugging Face base_model_tp_plan; set "
            "policy.dtensor_cfg.custom_parallel_plan or use tensor_parallel_size=1"
        )
    prefix = model.base_model_prefix
    return {f"{prefix}.{pattern}": _HF_STYLES[style]() for pattern, style in hf_plan.items() if style in _HF_STYLES}


# The decoder layer `sequence_parallel_plan` knows: pre-norm attention and MLP blocks with one residual add each.
_SP_LAYER_CHILDREN = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}


def sequence_parallel_plan(model: nn.Module, plan: Mapping[str, ParallelStyle]) -> dict[str, ParallelStyle]:
    """``plan`` with the residual stream split along the sequence over the ``tp`` ranks (Megatron's sequence
    parallelism, ``dtensor_cfg.sequence_parallel``): each rank keeps 1/tp of the tokens between the attention and
    MLP blocks, runs the norms on them, and gathers the whole sequence only inside attention and the MLP, whose
    row-wise outputs are reduce-scattered instead of all-reduced. The final norm gathers it back, so the head sees
    the plain full sequence. Uneven splits are fine: the stream stays a DTensor that knows its global length.

    Raises ValueError for a decoder layer of another form (e.g. Gemma's extra norms, MoE blocks)."""
    prefix = str(model.base_model_prefix)
    layers = getattr(getattr(model, prefix, None), "layers", None)
    children = {name for name, _ in layers[0].named_children()} if layers else set()
    if children != _SP_LAYER_CHILDREN:
        raise ValueError(
            f"policy.dtensor_cfg.sequence_parallel: {type(model).__name__}'s decoder layers have "
            f"{sorted(children)}, not the pre-norm form {sorted(_SP_LAYER_CHILDREN)} sequence parallelism splits; "
            "set it to false"
        )
    sequence, whole = Shard(1), Replicate()
    rowwise_to_sequence = [pattern for pattern, style in plan.items() if isinstance(style, RowwiseParallel)]
    return {
        **plan,
        **{
            pattern: RowwiseParallel(output_layouts=sequence, use_local_output=False) for pattern in rowwise_to_sequence
        },
        f"{prefix}.embed_tokens": PrepareModuleOutput(
            output_layouts=whole, desired_output_layouts=sequence, use_local_output=False
        ),
        f"{prefix}.layers.*.input_layernorm": SequenceParallel(),
        f"{prefix}.layers.*.post_attention_layernorm": SequenceParallel(),
        f"{prefix}.layers.*.self_attn": PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": sequence},
            desired_input_kwarg_layouts={"hidden_states": whole},
            use_local_output=True,
        ),
        f"{prefix}.layers.*.mlp": PrepareModuleInput(
            input_layouts=(sequence,), desired_input_layouts=(whole,), use_local_output=True
        ),
        f"{prefix}.norm": PrepareModuleInput(
            input_layouts=(sequence,), desired_input_layouts=(whole,), use_local_output=True
        ),
    }


def check_tensor_parallel_fits(model: nn.Module, tensor_parallel_size: int) -> None:
    """Head counts and the MLP width must split evenly over ``tp`` ranks (the sharded views assume it)."""
    config = model.config
    for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = getattr(config, key, None)
        if value is not None and value % tensor_parallel_size:
            raise ValueError(
                f"policy.dtensor_cfg.tensor_parallel_size={tensor_parallel_size} must divide the model's {key}={value}"
            )


def _matching_modules(model: nn.Module, plan: Mapping[str, ParallelStyle]) -> dict[str, ParallelStyle]:
    """Expand ``*`` patterns of a plan to concrete module paths (``parallelize_module`` wants exact paths)."""
    names = [name for name, _ in model.named_modules()]
    concrete: dict[str, ParallelStyle] = {}
    for pattern, style in plan.items():
        matches = [name for name in names if fnmatch.fnmatchcase(name, pattern)]
        if not matches:
            raise ValueError(f"tensor-parallel plan entry {pattern!r} matches no module of {type(model).__name__}")
        concrete.update(dict.fromkeys(matches, style))
    return concrete


def parallelize(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    param_dtype: torch.dtype,
    tensor_parallel_plan: Mapping[str, ParallelStyle] | None,
    activation_checkpointing: bool,
    cpu_offload: bool,
    expert_mesh: DeviceMesh | None = None,
) -> nn.Module:
    """Apply TP (when ``tp > 1``), expert parallelism (with an ``("edp", "ep")`` ``expert_mesh``, see
    `expert_parallel`), activation checkpointing and FSDP2 to ``model`` in place; return it.

    FSDP is skipped when there is one data-parallel rank and nothing needs it (fp32, no offload).

    Master weights stay fp32; ``param_dtype`` is the compute dtype (bf16 all-gathers, fp32 gradient reduction).
    ``cpu_offload`` keeps sharded parameters, gradients and optimizer state in CPU memory (FSDP's
    ``CPUOffloadPolicy``); on a CPU-only machine that is where they already are, so it is a no-op there.
    """
    if mesh["tp"].size() > 1:
        assert tensor_parallel_plan is not None
        check_tensor_parallel_fits(model, mesh["tp"].size())
        parallelize_module(model, mesh["tp"], _matching_modules(model, tensor_parallel_plan))
    if activation_checkpointing:
        # Hugging Face's own checkpointing keeps parameter names unchanged (a checkpoint wrapper would prefix them).
        cast(PreTrainedModel, model).gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False}
        )
    offload_needs_fsdp = cpu_offload and mesh.device_type != "cpu"
    shard_mesh = fsdp_mesh(mesh)
    if shard_mesh.size() == 1 and param_dtype == torch.float32 and not offload_needs_fsdp and expert_mesh is None:
        # FSDP over a single data-parallel rank shards nothing and only adds copies: on CPU it made a 135M-param
        # training step 1.4x slower (gather + reduce-scatter buffers every layer). The plain module trains the same.
        return model.to(mesh.device_type)
    mixed_precision = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    # FSDP's CPU offload pins host memory, which needs an accelerator; without one everything is in CPU memory anyway.
    offload = CPUOffloadPolicy() if offload_needs_fsdp else OffloadPolicy()
    layer_classes = set(getattr(model, "_no_split_modules", None) or [])
    layers = [module for module in model.modules() if type(module).__name__ in layer_classes]
    if not layers:
        raise ValueError(f"{type(model).__name__} declares no _no_split_modules; cannot find its decoder layers")
    if expert_mesh is not None:
        for experts in expert_parallel.shard_experts(model, expert_mesh):
            # Sharded over the ranks holding the same experts; inside, before its layer claims its parameters.
            fully_shard(experts, mesh=expert_mesh["edp"], mp_policy=mixed_precision, offload_policy=offload)
            # An expert's gradient already sums its EP group's tokens (the dispatch's backward); dividing by all
            # data-parallel ranks, as for every other parameter, makes it the same mean over the whole batch.
            cast(FSDPModule, experts).set_gradient_divide_factor(float(shard_mesh.size()))
    for layer in layers:
        fully_shard(layer, mesh=shard_mesh, mp_policy=mixed_precision, offload_policy=offload)
    fully_shard(model, mesh=shard_mesh, mp_policy=mixed_precision, offload_policy=offload)
    return model


def reshard(model: nn.Module) -> None:
    """Free every gathered (unsharded) parameter so that the next forward gathers the shards afresh.

    FSDP keeps the root's parameters gathered after a forward without backward (inference); writes to the shards
    (reference-weight swaps, checkpoint loads) would otherwise not be seen by the next forward.
    """
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def clip_grad_norm_(parameters: Iterable[nn.Parameter], max_norm: float | None) -> torch.Tensor:
    """Global L2 norm of all gradients (all ranks, all shards), then clip to ``max_norm`` when it is not None.

    With TP, parameters live on two meshes (``dp`` for replicated ones, ``dp x tp`` for sharded ones) and
    ``torch.nn.utils.clip_grad_norm_`` cannot combine DTensors of different meshes, so the norm is taken per mesh
    and combined here. A collective: every rank must call it.
    """
    groups: dict[Any, tuple[list[nn.Parameter], list[torch.Tensor]]] = {}
    for param in parameters:
        if param.grad is None:
            continue
        key = _mesh_key(param.grad)
        params, grads = groups.setdefault(key, ([], []))
        params.append(param)
        grads.append(param.grad)
    squares = []
    with quiet_redistribute_warnings():
        for _, grads in groups.values():
            norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
            squares.append((norm.full_tensor() if isinstance(norm, DTensor) else norm).float().square())
    if not squares:
        return torch.tensor(0.0)
    total_norm = torch.stack([s.to(squares[0].device) for s in squares]).sum().sqrt()
    if max_norm is not None:
        for params, _ in groups.values():
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, total_norm)
    return total_norm


def _mesh_key(tensor: torch.Tensor) -> Any:
    if isinstance(tensor, DTensor):
        mesh = tensor.device_mesh
        return (mesh.mesh_dim_names, tuple(mesh.mesh.flatten().tolist()))
    return None


@contextlib.contextmanager
def quiet_redistribute_warnings() -> Iterator[None]:
    """Silence DTensor's advice to flatten the 2-D mesh when reducing or gathering a ``dp x tp`` tensor.

    The two sequential collectives it warns about run in the same order on every rank, so the result is identical
    everywhere; the warning would otherwise print on every optimizer step and every full state dict.
    """
    log = logging.getLogger("torch.distributed.tensor._redistribute")
    previous = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(previous)
