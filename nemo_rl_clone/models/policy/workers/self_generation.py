"""Generation by the policy's own workers (``policy.generation.backend: megatron``, NeMo-RL's colocated Megatron
generation): the model that trains also samples, so there are no engine weights to refit and the sampled tokens'
logprobs come from the very forward pass the trainer runs.

Each decoding step runs the worker's forward-only pass (`_inference_pass`: its pipeline schedule, tensor- and
sequence-parallel layout, microbatches of ``logprob_batch_size`` rows) over the rows still generating, reads each
row's next-token logits at its last position (the whole vocabulary), and samples from them under the sampler's
processing the trainer reproduces (`contract.sampling.processed_logits`: temperature, top-k, top-p). No KV cache:
every step recomputes the sequence, so a step costs a forward pass over the sequences so far. It is exact, not fast:
vLLM is the fast path.

Per-row seeds (``data["seeds"]``, as GRPO passes them) seed one generator per row, so a sample is the same on any
data-parallel rank. A row stops at the tokenizer's end-of-sequence token or one of ``stop_token_ids`` (kept in its
output, as vLLM keeps it), at ``max_new_tokens``, or where ``policy.max_total_sequence_length`` ends (both
``truncated``).
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_rl_clone.contract.sampling import processed_logits
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict

DEFAULT_SEED = 0  # rows without a seed of their own: seed + row index


def generate(worker: Any, data: BatchedDataDict, micro_batch_size: int | None, greedy: bool) -> BatchedDataDict:
    """This rank's shard of a generation batch (the interfaces module's input and output formats); the output is
    ``max_new_tokens`` wider than the input for every shard alike."""
    cfg = worker.cfg.generation
    input_ids, lengths = data["input_ids"].cpu(), data["input_lengths"].cpu().long()
    rows, width = input_ids.shape
    pad = _pad_token_id(worker.tokenizer)
    output_ids = torch.full((rows, width + cfg.max_new_tokens), pad, dtype=input_ids.dtype)
    output_ids[:, :width] = input_ids
    logprobs = torch.zeros(output_ids.shape, dtype=torch.float32)
    limits = torch.clamp(worker.cfg.max_total_sequence_length - lengths, max=cfg.max_new_tokens)
    generated = torch.zeros(rows, dtype=torch.long)
    stopped = torch.zeros(rows, dtype=torch.bool)
    stop_ids = _stop_token_ids(worker.tokenizer, cfg.stop_token_ids)
    generators = [torch.Generator().manual_seed(seed) for seed in _row_seeds(data, rows)]
    greedy = greedy or cfg.temperature == 0
    while True:
        active = ((~stopped) & (generated < limits)).nonzero().flatten()
        if active.numel() == 0:
            break
        current = lengths[active] + generated[active]
        step = BatchedDataDict(
            {"input_ids": output_ids[active, : int(current.max())].clone(), "input_lengths": current.clone()}
        )
        logits = _next_token_logits(worker, step, micro_batch_size)  # [active, V] fp32
        targets = logits.argmax(dim=-1)
        processed = processed_logits(logits, targets, worker.sampling)
        row_logprobs = torch.log_softmax(processed, dim=-1)
        if greedy:
            tokens = targets
        else:
            probs = row_logprobs.exp()
            tokens = torch.stack(
                [torch.multinomial(probs[i], 1, generator=generators[int(r)])[0] for i, r in enumerate(active)]
            )
        output_ids[active, current] = tokens.to(output_ids.dtype)
        logprobs[active, current] = row_logprobs.gather(-1, tokens[:, None]).squeeze(-1)
        generated[active] += 1
        stopped[active] = torch.isin(tokens, stop_ids)
    return BatchedDataDict(
        {
            "output_ids": output_ids,
            "logprobs": logprobs,
            "generation_lengths": generated,
            "unpadded_sequence_lengths": lengths + generated,
            "truncated": ~stopped,
        }
    )


def _next_token_logits(worker: Any, step: BatchedDataDict, micro_batch_size: int | None) -> torch.Tensor:
    """``[rows, V]`` fp32 logits of each row's next token, the whole vocabulary on every rank."""
    whole = getattr(worker, "_whole_vocabulary", lambda logits: logits)

    def last_position(microbatch: BatchedDataDict, forward: Any) -> torch.Tensor:
        logits = whole(forward())
        positions = microbatch["input_lengths"].to(logits.device).long() - 1
        return logits[torch.arange(logits.shape[0], device=logits.device), positions].float().cpu()

    return worker._inference_pass(step, micro_batch_size, last_position)


def _row_seeds(data: BatchedDataDict, rows: int) -> list[int]:
    seeds = data.get("seeds")
    if seeds is None:
        return [DEFAULT_SEED + row for row in range(rows)]
    return [int(s) for s in (seeds.tolist() if isinstance(seeds, torch.Tensor) else seeds)]


def _stop_token_ids(tokenizer: Any, configured: list[int] | None) -> torch.Tensor:
    ids = set(configured or [])
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return torch.tensor(sorted(ids), dtype=torch.long)


def _pad_token_id(tokenizer: Any) -> int:
    return int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
