"""Context parallelism on CPU: one DTensor policy worker over whole sequences vs ``--cp`` workers each holding 1/cp
of every sequence (ring attention, ``policy.dtensor_cfg.context_parallel_size``), in one invocation.

The ``policy`` section of ``configs/sft.yaml`` (SmolLM2-135M, fp32, AdamW) without sequence packing, trained with an NLL loss on
``--batch`` random sequences of ``--seq-len`` tokens (one microbatch), ``--steps`` training calls after one warm-up
call. Each layout runs in fresh processes with the machine's cores split between its ranks (cp=1: one process
with all cores; cp=N: N processes with cores/N each). Reported per layout: the median training-call time and the
largest per-rank peak resident memory (``ru_maxrss``: weights, gradients, Adam state, activations; with cp > 1
FSDP also shards the weights over the cp ranks). Prints ``cp<N>_time_ratio`` and ``cp<N>_peak_ratio`` (cp=N over
cp=1) last. Both layouts compute the same loss (printed) to fp32 rounding.

    uv run --no-sync python benchmarks/context_parallel.py [--cp 2] [--seq-len 2048] [--batch 2] [--steps 2]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[1]


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, results: Any) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))

    from nemo_rl_clone.algorithms.loss import NLLLossFn
    from nemo_rl_clone.algorithms.sft import SFTMasterConfig
    from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
    from nemo_rl_clone.models.huggingface import load_tokenizer, resolve_model_path
    from nemo_rl_clone.models.policy.dtensor.policy_worker import DTensorPolicyWorker
    from nemo_rl_clone.utils.config import load_validated_config

    overrides = [
        "policy.sequence_packing.enabled=false",
        f"policy.dtensor_cfg.context_parallel_size={world}",
        f"policy.train_global_batch_size={args.batch}",
        f"policy.train_micro_batch_size={args.batch}",
        f"policy.max_total_sequence_length={args.seq_len}",
    ]
    config = load_validated_config(REPO / "configs" / "sft.yaml", overrides, SFTMasterConfig)
    model_path = resolve_model_path(config.policy.model_name)
    tokenizer = load_tokenizer(model_path)
    worker = DTensorPolicyWorker(config.policy, tokenizer, model_path, init_reference_model=False)
    generator = torch.Generator().manual_seed(0)
    data = BatchedDataDict(
        input_ids=torch.randint(0, len(tokenizer), (args.batch, args.seq_len), generator=generator),
        input_lengths=torch.full((args.batch,), args.seq_len),
        token_mask=torch.ones(args.batch, args.seq_len),
        sample_mask=torch.ones(args.batch),
    )
    times, losses = [], []
    for step in range(args.steps + 1):
        start = time.perf_counter()
        result = worker.train(data, NLLLossFn())
        if step:  # the first call warms up
            times.append(time.perf_counter() - start)
        losses.append(float(result["global_loss"][0]))
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    results.put((rank, statistics.median(times), peak_gb, losses))
    worker.shutdown()


def run_layout(world: int, args: argparse.Namespace) -> dict[str, Any]:
    from nemo_rl_clone.models.policy.workers.worker_setup import free_local_port

    port = free_local_port()
    context = mp.get_context("spawn")
    results = context.Queue()
    mp.start_processes(_rank, args=(world, port, args, results), nprocs=world, join=True, start_method="spawn")
    rows = [results.get() for _ in range(world)]
    return {
        "train_s": max(row[1] for row in rows),
        "peak_gb": max(row[2] for row in rows),
        "losses": rows[0][3],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cp", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2, help="timed training calls after one warm-up call")
    args = parser.parse_args()
    if args.seq_len % (2 * args.cp):
        parser.error(f"--seq-len must be a multiple of 2 x --cp ({2 * args.cp}) to compare equal work")
    layouts = {1: run_layout(1, args), args.cp: run_layout(args.cp, args)}
    for world, result in layouts.items():
        losses = " ".join(f"{loss:.5f}" for loss in result["losses"])
        print(f"cp={world}: train_s={result['train_s']:.2f} peak_gb={result['peak_gb']:.2f} losses={losses}")
    base, split = layouts[1], layouts[args.cp]
    print(f"cp{args.cp}_time_ratio={split['train_s'] / base['train_s']:.2f}")
    print(f"cp{args.cp}_peak_ratio={split['peak_gb'] / base['peak_gb']:.2f}")


if __name__ == "__main__":
    main()
