"""Generation speed of our engine as the main job runs it, against plain vLLM at its fastest on this CPU, in one
invocation on the main job's prompts and sampling settings.

The main job (`configs/grpo_smollm2_cpu.yaml`): SmolLM2-135M-Instruct, its first 8 templated training prompts × 4
samples, up to 128 new tokens at temperature 1, one seed per sample. Three engines answer the same 32 requests:

- ``ours``: `VllmGeneration` (a Ray actor, the in-process engine core) built from the main job's own
  ``policy.generation`` section (fp32, compiled, vLLM's sampler, processed logprobs), with the main job's thread
  count (all cores); ``--ours policy.generation.vllm_cfg.sampler=inverse_cdf`` for the inverse-CDF sampler;
- ``fp32``: plain ``vllm.LLM`` in its own process at the fastest fp32 configuration measured here: ``dtype`` given
  explicitly, the engine core in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), ``OMP_NUM_THREADS`` = the cores,
  vLLM's default compilation, one request per sample, ``max_num_batched_tokens=4096``;
- ``bf16``: the same in bf16 (what vLLM's ``dtype="auto"`` picks for an fp32 checkpoint on CPU).

Every request runs to the 128 tokens (vLLM's ``ignore_eos`` on all three sides), so each engine does the same work:
with the inverse-CDF sampler (``models/generation/vllm/inverse_cdf_sampler.py``) our engine's samples, and where they
end, differ from plain vLLM's, and a decode step costs nearly the same with fewer rows left, which would bias a per-token rate towards
the side that happened to stop later. ``--stop-at-eos`` runs the main job's stopping instead (rates per generated
token, as above). Each engine is warmed up (one call, which also compiles), then the three answer ``--rounds`` calls
in turn, so that load from other processes hits them alike; an engine's time is its median call (refit excluded:
none happens).
Prints each engine's tokens, median seconds and decode tokens/s, those as fractions of the machine's matmul ceiling
at the model's decode shapes (2 FLOPs per parameter per token against `decode_ceilings`, torch's best GFLOP/s
for the 32-row matmuls of one token, FLOP-weighted), then ``ratio=`` (fp32's median time / ours, per generated
token: >= 1.0 means ours is at least as fast as plain fp32 vLLM) and ``bf16_ratio=`` (the same against bf16).

    uv run --no-sync python benchmarks/generation.py [--rounds 3] [--prompts 8] [--samples 4] [--stop-at-eos]
        [--ours KEY=VALUE ...]

``--ours`` changes our engine's side only (e.g. ``policy.generation.vllm_cfg.enforce_eager=false``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MAIN_JOB = REPO / "configs" / "grpo_smollm2_cpu.yaml"
PLAIN_BATCHED_TOKENS = 4096
KV_CACHE_BYTES = 1 << 30  # the main job's


def main_job_requests(prompts: int, samples: int, overrides: list[str] | None = None) -> tuple[Any, list[list[int]]]:
    """The main job's config (with ``overrides``) and its first ``prompts`` templated training prompts, each repeated
    ``samples`` times."""
    from nemo_rl_clone.algorithms import registry
    from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
    from nemo_rl_clone.models.huggingface import load_tokenizer, resolve_model_path
    from nemo_rl_clone.utils.config import load_validated_config

    config = load_validated_config(MAIN_JOB, overrides or [], GRPOMasterConfig)
    tokenizer = load_tokenizer(resolve_model_path(config.policy.model_name))
    train, _, _ = registry.algorithm_for(config).datasets(config, tokenizer)
    ids = []
    for index in range(prompts):
        row = train[index]
        ids.append([int(t) for message in row["message_log"] for t in message["token_ids"]])
    return config, [prompt for prompt in ids for _ in range(samples)]


def plain_child(variant: str, prompts: int, samples: int, ignore_eos: bool) -> None:
    """A plain vLLM process: one `vllm.LLM` at ``variant``'s precision, answering each ``run`` line on stdin."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from nemo_rl_clone.models.huggingface import resolve_model_path

    config, requests = main_job_requests(prompts, samples)
    generation = config.policy.generation
    llm = LLM(
        model=resolve_model_path(config.policy.model_name),
        dtype={"fp32": "float32", "bf16": "bfloat16"}[variant],
        seed=0,
        max_model_len=generation.vllm_cfg.max_model_len,
        max_num_batched_tokens=PLAIN_BATCHED_TOKENS,
        kv_cache_memory_bytes=KV_CACHE_BYTES,
    )
    prompts_in = [TokensPrompt(prompt_token_ids=ids) for ids in requests]
    params = [
        SamplingParams(
            temperature=generation.temperature, max_tokens=generation.max_new_tokens, seed=seed, ignore_eos=ignore_eos
        )
        for seed in range(len(requests))
    ]
    llm.generate(prompts_in, params, use_tqdm=False)  # warm-up (and compilation)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        start = time.perf_counter()
        outputs = llm.generate(prompts_in, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        print(json.dumps({"seconds": seconds, "tokens": sum(len(o.outputs[0].token_ids) for o in outputs)}), flush=True)


class PlainEngine:
    """`plain_child` in a subprocess with all cores' threads."""

    def __init__(self, variant: str, prompts: int, samples: int, ignore_eos: bool) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": str(os.cpu_count() or 1)}
        command = [sys.executable, __file__, "--plain-child", variant, "--prompts", str(prompts)]
        command += ["--samples", str(samples)] + ([] if ignore_eos else ["--stop-at-eos"])
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self._read()  # ready

    def _read(self) -> dict:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"the plain vLLM process exited with {self.process.wait()}")

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


class OurEngine:
    """`VllmGeneration` from the main job's generation section, threads as the main job gives them."""

    def __init__(self, prompts: int, samples: int, overrides: list[str]) -> None:
        import torch

        from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
        from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster, init_ray
        from nemo_rl_clone.models.generation.vllm import VllmGeneration

        config, requests = main_job_requests(prompts, samples, overrides)
        width = max(len(ids) for ids in requests)
        self.data = BatchedDataDict(
            input_ids=torch.tensor([ids + [0] * (width - len(ids)) for ids in requests]),
            input_lengths=torch.tensor([len(ids) for ids in requests]),
            seeds=torch.arange(len(requests)),
        )
        init_ray()
        self.cluster = RayVirtualCluster([1], use_gpus=False, name="bench-gen")
        threads = {"OMP_NUM_THREADS": str(os.cpu_count() or 1)}
        self.generation = VllmGeneration(
            self.cluster, config.policy.generation, config.policy.model_name, env_vars=threads
        )
        self.generation.generate(self.data)  # warm-up, as on the plain side

    def run(self) -> tuple[float, int]:
        start = time.perf_counter()
        out = self.generation.generate(self.data)
        return time.perf_counter() - start, int(out["generation_lengths"].sum())

    def close(self) -> None:
        self.generation.shutdown()
        self.cluster.shutdown()


def decode_ceilings(rows: int, layers: int) -> dict[str, float]:
    """The GFLOP/s a decode step of ``rows`` sequences could reach if every matmul ran at torch's best rate for its
    shape (SmolLM2's MLP, attention and vocabulary projections, forward layout): FLOP-weighted over one token's
    matmuls, fp32 and bf16."""
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from matmul_ceiling import ATTENTION, HIDDEN, MLP, VOCAB, best_gflops

    torch.set_num_threads(os.cpu_count() or 1)
    flops = {MLP: 3 * layers * HIDDEN * MLP, ATTENTION: layers * HIDDEN * ATTENTION, VOCAB: HIDDEN * VOCAB}
    ceilings = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        seconds = 0.0
        for width, count in flops.items():
            rate = best_gflops(torch.randn(rows, HIDDEN, dtype=dtype), torch.randn(HIDDEN, width, dtype=dtype), 5)
            seconds += count / rate
        ceilings[name] = sum(flops.values()) / seconds
    return ceilings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument(
        "--ours", nargs="*", default=[], metavar="KEY=VALUE", help="overrides of the main job's config for our engine"
    )
    parser.add_argument(
        "--stop-at-eos", action="store_true", help="stop at EOS as the main job does (rates per generated token)"
    )
    parser.add_argument("--plain-child", choices=["fp32", "bf16"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    ignore_eos = not args.stop_at_eos
    if args.plain_child:
        plain_child(args.plain_child, args.prompts, args.samples, ignore_eos)
        return

    from nemo_rl_clone.models.huggingface import SMOLLM2, resolve_model_path
    from nemo_rl_clone.models.memory_estimate import ModelShape

    ours = [*args.ours, "+policy.generation.vllm_cfg.ignore_eos=true"] if ignore_eos else args.ours
    engines: dict[str, object] = {"ours": OurEngine(args.prompts, args.samples, ours)}
    try:
        engines["fp32"] = PlainEngine("fp32", args.prompts, args.samples, ignore_eos)
        engines["bf16"] = PlainEngine("bf16", args.prompts, args.samples, ignore_eos)
        times: dict[str, list[float]] = {name: [] for name in engines}
        tokens: dict[str, list[int]] = {name: [] for name in engines}
        for round_index in range(args.rounds):
            for name, engine in engines.items():
                seconds, count = engine.run()  # type: ignore[attr-defined]
                times[name].append(seconds)
                tokens[name].append(count)
                print(f"round {round_index} {name}: {count} tokens in {seconds:.2f} s", flush=True)
    finally:
        for engine in engines.values():
            engine.close()  # type: ignore[attr-defined]

    shape = ModelShape.of(resolve_model_path(SMOLLM2))
    parameters = shape.num_parameters
    ceilings = decode_ceilings(args.prompts * args.samples, shape.num_layers)
    rate = {}
    for name in engines:
        median = statistics.median(times[name])
        rate[name] = statistics.median(tokens[name]) / median
        ceiling = ceilings["bf16" if name == "bf16" else "fp32"]
        fraction = 2 * parameters * rate[name] / 1e9 / ceiling
        print(
            f"{name}: median {median:.2f} s, {statistics.median(tokens[name]):.0f} tokens, {rate[name]:.1f} tok/s, "
            f"{fraction:.3f} of the {'bf16' if name == 'bf16' else 'fp32'} matmul ceiling ({ceiling:.1f} GFLOP/s)"
        )
    print(f"bf16_ratio={rate['ours'] / rate['bf16']:.3f}")
    print(f"ratio={rate['ours'] / rate['fp32']:.3f}")


if __name__ == "__main__":
    main()
