"""Generation throughput of `VllmGeneration.generate` (1 engine in a Ray actor) vs `vllm.LLM.generate` called
directly in one plain process, same run, same settings.

SmolLM2-135M-Instruct, fp32, eager, 64 prompts x 128 new tokens, sampled at temperature 1.0 with per-prompt seeds
(both sides produce the same tokens, so they do the same work). Both engines use the same engine arguments and
sampling parameters (`engine_io.engine_kwargs` / `sampling_params`), the in-process engine core and the same
thread count; the rounds alternate so that load from other processes hits both alike. Throughput uses each side's
best round (least disturbed). Prints raw numbers, then ``ratio=<ours/direct>`` last (target >= 0.9).

    uv run --no-sync python benchmarks/generation.py [--prompts 64] [--max-new-tokens 128] [--rounds 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

KV_CACHE_BYTES = 256 << 20
MAX_MODEL_LEN = 512


def prompt_texts(count: int) -> list[str]:
    subjects = [
        "the moon",
        "a prime number",
        "photosynthesis",
        "the Roman empire",
        "a binary tree",
        "rain",
        "music",
        "gravity",
    ]
    return [
        f"Question {i}: explain {subjects[i % len(subjects)]} to a child in {3 + i % 5} sentences."
        for i in range(count)
    ]


def make_config(max_new_tokens: int):  # -> GenerationConfig (imported lazily: the child imports only what it needs)
    from nemo_rl_clone.models.generation.config import GenerationConfig, VllmConfig

    vllm_cfg = VllmConfig(
        precision="float32", max_model_len=MAX_MODEL_LEN, enforce_eager=True, kv_cache_memory_bytes=KV_CACHE_BYTES
    )
    return GenerationConfig(max_new_tokens=max_new_tokens, temperature=1.0, vllm_cfg=vllm_cfg)


def direct_child(model_path: str, prompts: int, max_new_tokens: int) -> None:
    """The baseline process: one `vllm.LLM`, answering each ``run`` line on stdin with a JSON result line."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from transformers import AutoTokenizer
    from vllm import LLM
    from vllm.inputs import TokensPrompt

    from nemo_rl_clone.models.generation.vllm.engine_io import engine_kwargs, sampling_params

    config = make_config(max_new_tokens)
    llm = LLM(**engine_kwargs(config, model_path, seed=0, on_gpu=False))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    requests = [TokensPrompt(prompt_token_ids=tokenizer(text)["input_ids"]) for text in prompt_texts(prompts)]
    params = [sampling_params(config, False, max_new_tokens, None, seed) for seed in range(prompts)]
    llm.generate(requests[:2], params[:2], use_tqdm=False)  # warm-up, as on our side
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        start = time.perf_counter()
        outputs = llm.generate(requests, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        tokens = sum(len(out.outputs[0].token_ids) for out in outputs)
        print(json.dumps({"seconds": seconds, "tokens": tokens}), flush=True)


class DirectEngine:
    def __init__(self, model_path: str, prompts: int, max_new_tokens: int, threads: int) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        command = [
            sys.executable,
            __file__,
            "--direct-child",
            model_path,
            "--prompts",
            str(prompts),
            "--max-new-tokens",
            str(max_new_tokens),
        ]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self._read()  # ready

    def _read(self) -> dict:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"the direct vLLM process exited with {self.process.wait()}")

    def run(self) -> tuple[float, int]:
        assert self.process.stdin is not None
        self.process.stdin.write("run\n")
        self.process.stdin.flush()
        result = self._read()
        return result["seconds"], result["tokens"]

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each engine")
    parser.add_argument("--direct-child", metavar="MODEL_PATH", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.direct_child:
        direct_child(args.direct_child, args.prompts, args.max_new_tokens)
        return

    import torch

    from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
    from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster, init_ray
    from nemo_rl_clone.models.generation.vllm import VllmGeneration
    from nemo_rl_clone.models.huggingface import SMOLLM2, load_tokenizer, resolve_model_path

    model_path = resolve_model_path(SMOLLM2)
    tokenizer = load_tokenizer(model_path)
    tokenizer.padding_side = "right"
    encoded = tokenizer(prompt_texts(args.prompts), padding=True, return_tensors="pt")
    data = BatchedDataDict(
        input_ids=encoded["input_ids"],
        input_lengths=encoded["attention_mask"].sum(dim=1),
        seeds=torch.arange(args.prompts),
    )
    init_ray()
    cluster = RayVirtualCluster([1], use_gpus=False, name="bench-gen")
    generation = VllmGeneration(
        cluster, make_config(args.max_new_tokens), model_path, env_vars={"OMP_NUM_THREADS": str(args.threads)}
    )
    generation.generate(data.slice(0, 2))  # warm-up, as on the direct side
    direct = DirectEngine(model_path, args.prompts, args.max_new_tokens, args.threads)
    try:
        ours, theirs = [], []
        for round_index in range(args.rounds):
            start = time.perf_counter()
            out = generation.generate(data)
            seconds = time.perf_counter() - start
            tokens = int(out["generation_lengths"].sum())
            ours.append(tokens / seconds)
            direct_seconds, direct_tokens = direct.run()
            theirs.append(direct_tokens / direct_seconds)
            print(
                f"round {round_index}: VllmGeneration {tokens} tokens in {seconds:.2f} s ({ours[-1]:.1f} tok/s); "
                f"vllm.LLM {direct_tokens} tokens in {direct_seconds:.2f} s ({theirs[-1]:.1f} tok/s)"
            )
            if tokens != direct_tokens:
                print(f"note: token counts differ ({tokens} vs {direct_tokens}); throughput is per generated token")
    finally:
        direct.close()
        generation.shutdown()
        cluster.shutdown()
    print(f"VllmGeneration best: {max(ours):.1f} tok/s; vllm.LLM direct best: {max(theirs):.1f} tok/s")
    print(f"ratio={max(ours) / max(theirs):.3f}")


if __name__ == "__main__":
    main()
