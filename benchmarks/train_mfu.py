"""Training throughput and MFU of the DTensor policy worker on a ~0.5B model, bf16 against fp32, in one invocation.

Each precision runs in a fresh child process holding one worker in-process (world size 1, no Ray: the GPU machines
this is meant for have torch and transformers but no Ray). The model is Qwen2.5-0.5B's architecture with random
weights (494 M parameters; no hub needed: weights do not change the speed), written once to ``--work-dir``;
``--model`` takes any local folder or built-in name instead (``tiny-random-llama`` for a quick CPU check). Each step
is one ``train`` call (NLL loss, AdamW, sequence packing) on ``--samples`` random sequences of ``--seq-len`` tokens
(lengths drawn from [seq_len/2, seq_len], a 64-token prompt masked out). Reported per precision: median step time
after ``--warmup`` steps, valid tokens/s, model TFLOP/s (6 × parameters × valid tokens), and MFU (the worker's own
``train_fp_utilization``: against the device's dense peak, known for H100/H200/A100; ``--peak-tflops`` for others).
Prints ``bf16_over_fp32=<fp32 step / bf16 step>`` last.

    python benchmarks/train_mfu.py [--precisions bfloat16,float32] [--steps 5] [--warmup 2] [--samples 16]
        [--seq-len 2048] [--train-mb-tokens 16384] [--activation-checkpointing] [--model PATH_OR_NAME]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
QWEN25_05B = "qwen2.5-0.5b-random"
PROMPT_TOKENS = 64


def qwen25_05b_folder(work_dir: Path) -> Path:
    """Qwen2.5-0.5B's shapes (hidden 896, 24 layers, 14 heads / 2 KV heads, MLP 4,864, vocab 151,936, tied
    embeddings) with random weights and the built-in tokenizer, saved under ``work_dir`` once."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from nemo_rl_clone.models.huggingface import TINY_QWEN2, load_tokenizer, resolve_model_path

    folder = work_dir / QWEN25_05B
    if (folder / "config.json").exists():
        return folder
    config = Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1e6,
        tie_word_embeddings=True,
        use_sliding_window=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    partial = folder.with_name(folder.name + ".partial")
    model.save_pretrained(partial)
    load_tokenizer(resolve_model_path(TINY_QWEN2)).save_pretrained(partial)
    partial.rename(folder)
    return folder


def make_batch(vocab_size: int, samples: int, seq_len: int) -> Any:
    import torch

    from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict

    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(seq_len // 2, seq_len + 1, (samples,), generator=generator)
    positions = torch.arange(seq_len)
    valid = positions[None, :] < lengths[:, None]
    return BatchedDataDict(
        input_ids=torch.randint(0, vocab_size, (samples, seq_len), generator=generator) * valid,
        input_lengths=lengths,
        token_mask=(valid & (positions[None, :] >= PROMPT_TOKENS)).float(),
        sample_mask=torch.ones(samples),
    )


def child(args: argparse.Namespace, precision: str) -> dict[str, float]:
    import torch

    from nemo_rl_clone.algorithms.loss import NLLLossFn
    from nemo_rl_clone.models.huggingface import load_tokenizer, resolve_model_path
    from nemo_rl_clone.models.policy.config import PolicyConfig
    from nemo_rl_clone.models.policy.dtensor.policy_worker import DTensorPolicyWorker
    from nemo_rl_clone.models.policy.workers import worker_setup
    from nemo_rl_clone.models.policy.workers.train_profile import profile_metrics
    from nemo_rl_clone.utils.config_validation import validate_config

    model_path = (
        str(qwen25_05b_folder(Path(args.work_dir))) if args.model == QWEN25_05B else resolve_model_path(args.model)
    )
    worker_setup.set_single_process_env()
    config = validate_config(
        {
            "model_name": model_path,
            "precision": precision,
            "train_global_batch_size": args.samples,
            "train_micro_batch_size": args.samples,
            "logprob_batch_size": args.samples,
            "max_total_sequence_length": args.seq_len,
            "dtensor_cfg": {"activation_checkpointing": args.activation_checkpointing},
            "sequence_packing": {
                "enabled": True,
                "train_mb_tokens": args.train_mb_tokens,
                "logprob_mb_tokens": args.train_mb_tokens,
            },
            "optimizer": {"name": "torch.optim.AdamW", "kwargs": {"lr": 1e-6}},
        },
        PolicyConfig,
    )
    worker = DTensorPolicyWorker(config, load_tokenizer(model_path), model_path, init_reference_model=False)
    data = make_batch(worker.model.config.vocab_size, args.samples, args.seq_len)
    times, profiles = [], []
    for _ in range(args.warmup + args.steps):
        start = time.perf_counter()
        result = worker.train(data, NLLLossFn())
        times.append(time.perf_counter() - start)
        profiles.append(result["profile"])
    timed = list(range(args.warmup, len(times)))
    median = sorted(timed, key=lambda i: times[i])[len(timed) // 2]
    performance = profile_metrics(profiles[median], times[median])["performance"]
    if "train_fp_utilization" not in performance and args.peak_tflops:
        performance["train_fp_utilization"] = performance["train_gflops"] / (args.peak_tflops * 1e3)
    peak_memory_gb = torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else 0.0
    worker.shutdown()
    return {
        "step_s": times[median],
        "tokens_per_s": profiles[median].valid_tokens / times[median],
        "tflops": performance["train_gflops"] / 1e3,
        "mfu": performance.get("train_fp_utilization", float("nan")),
        "forward_s": profiles[median].forward_s,
        "backward_s": profiles[median].backward_s,
        "optimizer_s": profiles[median].optimizer_s,
        "step_s_spread": statistics.pstdev(times[i] for i in timed) if len(timed) > 1 else 0.0,
        "gpu_peak_memory_gb": peak_memory_gb,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=QWEN25_05B, help=f"{QWEN25_05B} (default), a local folder or built-in name")
    parser.add_argument("--work-dir", default="/tmp/nemo_rl_clone_train_mfu", help="where the random model is saved")
    parser.add_argument("--precisions", default="bfloat16,float32")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--train-mb-tokens", type=int, default=16384)
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--peak-tflops", type=float, default=0.0, help="device peak for MFU when not in the table")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args, args.child)))
        return
    precisions = args.precisions.split(",")
    if unknown := sorted(set(precisions) - {"bfloat16", "float32"}):
        sys.exit(f"--precisions: unknown {unknown}; choose from bfloat16, float32")
    results = {}
    for precision in precisions:
        command = [sys.executable, __file__, *sys.argv[1:], "--child", precision]
        proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"{precision}: failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        results[precision] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{precision:9s} " + " ".join(f"{key}={value:.4g}" for key, value in results[precision].items()))
    if {"bfloat16", "float32"} <= results.keys():
        print(f"bf16_over_fp32={results['float32']['step_s'] / results['bfloat16']['step_s']:.2f}")


if __name__ == "__main__":
    main()
