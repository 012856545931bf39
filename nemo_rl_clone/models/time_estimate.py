"""How long a GRPO step will take, from the model's shapes, the step's token counts and this machine's measured
rates (`machine_rates`): the dry run's time plan. No constant here is fitted to a run; every time is work over a rate.

Per phase, with F = 2 × (the decoder's linear parameters per token) and the head's 2 × hidden × vocabulary:

- generation: a decode step costs ``decode_fixed_s + decode_row_s × rows running`` (weights streamed once per step,
  each row's share of the matmuls and the sampler) plus reading each row's KV cache; the longest response sets the
  number of steps (``max_new_tokens`` per turn), the rows' total response tokens the row term; prompts are prefilled
  at the training matmul rate. ``max_num_seqs`` caps the rows running at once.
- logprob passes (the pre-update policy's when the loss reads them, the reference's for a KL term): one forward over
  every sample;
- training: forward and backward (3 × the forward's FLOPs) over the samples that train, at the training matmul
  rate, plus one AdamW step over the worker's share of the parameters;
- weight sync: the weights in the engine's precision copied twice (gathered, then loaded), then prepared for the
  engine's GEMM;
- validation: its generation, spread over ``val_period`` steps.

Data-parallel workers and engines divide the tokens; on CPU a split layout gives each side its cores, and each side's
rates are probed at its thread count (memory-bound work does not slow in proportion). An engine of several
tensor-parallel devices is taken as that many times faster. Not modelled: Python and RPC overheads per call, the
environment's scoring, logging.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nemo_rl_clone.models.machine_rates import MachineRates
from nemo_rl_clone.models.memory_estimate import PRECISION_BYTES, ModelShape

PHASES = ("generation", "logprobs", "training", "weight_sync")


@dataclass(frozen=True)
class Rollout:
    """One generation call's tokens: ``rows`` samples, each a prompt of ``prompt_tokens`` and ``response_tokens``
    generated over ``turns`` turns of at most ``max_new_tokens`` each."""

    rows: int
    prompt_tokens: float
    response_tokens: float
    max_new_tokens: int
    turns: float = 1.0


@dataclass(frozen=True)
class StepWork:
    """What one step computes: its rollout, the samples that train, the forward-only logprob passes, validation."""

    rollout: Rollout
    trained_samples: float
    logprob_passes: int
    validation: Rollout | None = None  # one validation batch
    val_batches: int = 0
    val_period: int = 0


@dataclass(frozen=True)
class Layout:
    """Where the phases run: ``policy_workers`` data-parallel trainers and ``engines`` engines (each
    ``engine_parallel`` devices wide); on CPU the threads each side has (0: all the cores, colocated groups take
    turns); ``overlap``: generation runs beside training (async GRPO)."""

    name: str
    policy_workers: int = 1
    engines: int = 1
    engine_parallel: int = 1
    policy_threads: int = 0
    engine_threads: int = 0
    overlap: bool = False


def forward_flops_per_token(shape: ModelShape, context: float) -> float:
    """The decoder's forward FLOPs per token (the head excluded): its linear layers plus attention's two products over
    ``context`` earlier positions (half the sequence on average under the causal mask)."""
    h = shape.hidden_size
    heads = shape.num_attention_heads or 1
    head_dim = shape.head_dim or h // heads
    kv = (shape.num_key_value_heads or heads) * head_dim
    attention = h * heads * head_dim * 2 + h * kv * 2
    dense_mlp = 3 * h * shape.intermediate_size
    per_layer = attention + dense_mlp
    linear = float(per_layer * shape.num_layers)
    if shape.num_expert_parameters:  # MoE: everything but the embeddings, the routed experts at the share a token runs
        heads_and_embeddings = shape.vocab_size * h * (1 if shape.tied_embeddings else 2)
        dense = shape.num_parameters - heads_and_embeddings - shape.num_expert_parameters
        linear = dense + shape.num_expert_parameters * shape.active_expert_fraction
    return 2.0 * linear + 4.0 * shape.num_layers * heads * head_dim * context


def head_flops_per_token(shape: ModelShape) -> float:
    return 2.0 * shape.hidden_size * shape.vocab_size


def kv_bytes_per_position(shape: ModelShape, precision: str) -> float:
    heads = shape.num_attention_heads or 1
    head_dim = shape.head_dim or shape.hidden_size // heads
    kv_heads = shape.num_key_value_heads or heads
    return 2.0 * kv_heads * head_dim * shape.num_layers * PRECISION_BYTES.get(precision, 2)


def generation_s(
    shape: ModelShape, rollout: Rollout, rates: MachineRates, engine_precision: str, max_num_seqs: int
) -> float:
    """One engine's time for ``rollout`` (its rows only)."""
    if rollout.rows <= 0:
        return 0.0
    per_turn = rollout.response_tokens / max(rollout.turns, 1.0)
    tokens = rollout.rows * rollout.response_tokens
    running = max(1, min(rollout.rows, max_num_seqs))
    steps_per_turn = max(rollout.max_new_tokens, math.ceil(rollout.rows * per_turn / running))
    decode = steps_per_turn * rollout.turns * rates.decode_fixed_s + tokens * rates.decode_row_s
    # Each generated token reads its row's cache: the prompt plus, on average, half its own response so far.
    context = rollout.prompt_tokens + rollout.response_tokens / 2
    attention = tokens * context * kv_bytes_per_position(shape, engine_precision) / (rates.memory_gbps * 1e9)
    prefill_tokens = rollout.rows * (rollout.prompt_tokens + (rollout.turns - 1) * per_turn)
    # The head runs on each prefill's last position only: its logits start the response.
    prefill_flops = prefill_tokens * forward_flops_per_token(shape, rollout.prompt_tokens / 2) + (
        rollout.rows * rollout.turns * head_flops_per_token(shape)
    )
    return decode + attention + prefill_flops / (rates.train_gflops * 1e9)


def training_s(
    shape: ModelShape, samples: float, prompt: float, response: float, rates: MachineRates, head_at_loss_only: bool
) -> float:
    """Forward and backward over ``samples`` samples, then one AdamW step (the caller divides by workers)."""
    tokens = samples * (prompt + response)
    head_tokens = samples * response if head_at_loss_only else tokens
    flops = 3.0 * (
        tokens * forward_flops_per_token(shape, (prompt + response) / 2) + head_tokens * head_flops_per_token(shape)
    )
    return flops / (rates.train_gflops * 1e9)


def logprobs_s(shape: ModelShape, rollout: Rollout, rates: MachineRates, head_at_loss_only: bool) -> float:
    """One forward pass over every sample of the rollout."""
    length = rollout.prompt_tokens + rollout.response_tokens
    tokens = rollout.rows * length
    head_tokens = rollout.rows * rollout.response_tokens if head_at_loss_only else tokens
    flops = tokens * forward_flops_per_token(shape, length / 2) + head_tokens * head_flops_per_token(shape)
    return flops / (rates.train_gflops * 1e9)


def step_total(times: dict[str, float], layout: Layout) -> float:
    """A step from its phases: generation then the trainer's passes, or beside them (async), then the weight sync."""
    trainer = times["logprobs"] + times["training"]
    generation = times["generation"]
    return (max(generation, trainer) if layout.overlap else generation + trainer) + times["weight_sync"]


def step_time(
    shape: ModelShape,
    work: StepWork,
    layout: Layout,
    policy_rates: MachineRates,
    engine_rates: MachineRates,
    engine_precision: str,
    max_num_seqs: int,
    head_at_loss_only: bool = True,
) -> dict[str, float]:
    """Seconds per phase of one step under ``layout`` (each side at its measured rates), plus ``validation`` (one
    validation), ``validation_share`` (over its period) and ``step`` (the phases as the layout runs them)."""
    rollout = work.rollout
    engines = max(layout.engines, 1)
    workers = max(layout.policy_workers, 1)
    per_engine = Rollout(
        math.ceil(rollout.rows / engines),
        rollout.prompt_tokens,
        rollout.response_tokens,
        rollout.max_new_tokens,
        rollout.turns,
    )
    wide = engine_rates.scaled(layout.engine_parallel) if layout.engine_parallel > 1 else engine_rates
    times = {
        "generation": generation_s(shape, per_engine, wide, engine_precision, max_num_seqs),
        "logprobs": work.logprob_passes * logprobs_s(shape, rollout, policy_rates, head_at_loss_only) / workers,
        "training": (
            training_s(
                shape,
                work.trained_samples,
                rollout.prompt_tokens,
                rollout.response_tokens,
                policy_rates,
                head_at_loss_only,
            )
            / workers
            + shape.num_parameters / workers * policy_rates.adam_s_per_param
        ),
        "weight_sync": 2.0 * shape.num_parameters * PRECISION_BYTES.get(engine_precision, 2) / (wide.copy_gbps * 1e9)
        + shape.num_parameters * wide.engine_prepare_s_per_param,
    }
    times["step"] = step_total(times, layout)
    validation = 0.0
    if work.validation is not None and work.val_period > 0:
        val = work.validation
        per_engine_val = Rollout(
            math.ceil(val.rows / engines), val.prompt_tokens, val.response_tokens, val.max_new_tokens, val.turns
        )
        validation = work.val_batches * generation_s(shape, per_engine_val, wide, engine_precision, max_num_seqs)
    times["validation"] = validation
    times["validation_share"] = validation / work.val_period if work.val_period > 0 else 0.0
    return times
