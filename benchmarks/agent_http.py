"""The HTTP path against direct generation, in one invocation: one async engine (``vllm_cfg.async_engine``) serves
the same batch twice per round, once as one direct ``generate`` call (what GRPO's own rollouts do) and once as
concurrent ``/v1/completions`` requests from a real ``openai.AsyncOpenAI`` client (what an agent does), with
recording on. Every request samples exactly ``--tokens`` tokens (``ignore_eos``), so both paths do the same work.

Per path: the median over ``--rounds`` rounds (after one warm-up round each) of requests/s and generated tokens/s;
then ``ratio=`` (HTTP tokens/s over direct tokens/s; the goal is >= 0.8).

    uv run --no-sync python benchmarks/agent_http.py [--model SmolLM2-135M-Instruct] [--requests 32] [--tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import subprocess
import time


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import openai
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from nemo_rl_clone.models.generation.config import GenerationConfig, VllmConfig
    from nemo_rl_clone.models.generation.vllm import engine_io
    from nemo_rl_clone.models.generation.vllm.async_engine import AsyncEngine
    from nemo_rl_clone.models.huggingface import load_tokenizer, resolve_model_path

    path = resolve_model_path(args.model)
    tokenizer = load_tokenizer(args.model)
    vllm_cfg = VllmConfig(
        async_engine=True, expose_http_server=True, precision="float32", max_model_len=256, enforce_eager=True
    )
    config = GenerationConfig(max_new_tokens=args.tokens, vllm_cfg=vllm_cfg)
    engine = AsyncEngine(engine_io.engine_kwargs(config, path, 0, False))
    url = engine.serve_openai(path, args.model, "127.0.0.1", {})
    prompts = [f"Question {i}: what is {i} + {2 * i}? Think step by step." for i in range(args.requests)]
    token_prompts = [TokensPrompt(prompt_token_ids=tokenizer(p)["input_ids"]) for p in prompts]
    params = SamplingParams(max_tokens=args.tokens, min_tokens=args.tokens, ignore_eos=True, logprobs=0, seed=0)

    def direct() -> int:
        outputs = engine.generate(token_prompts, [params] * len(token_prompts))
        return sum(len(out.outputs[0].token_ids) for out in outputs)

    async def over_http() -> int:
        async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) as client:
            replies = await asyncio.gather(
                *(
                    client.completions.create(
                        model=args.model,
                        prompt=prompt,
                        max_tokens=args.tokens,
                        extra_body={"min_tokens": args.tokens, "ignore_eos": True},
                        extra_headers={"X-Episode-Id": f"bench-{i}"},
                    )
                    for i, prompt in enumerate(prompts)
                )
            )
        return sum(reply.usage.completion_tokens for reply in replies)

    def http() -> int:
        tokens = asyncio.run(over_http())
        engine.take_served_calls([f"bench-{i}" for i in range(len(prompts))])  # the records, as a rollout takes them
        return tokens

    timings: dict[str, list[tuple[float, int]]] = {"direct": [], "http": []}
    for round_index in range(args.rounds + 1):
        for name, run in (("direct", direct), ("http", http)):
            start = time.perf_counter()
            tokens = run()
            if round_index:  # round 0 warms both paths up
                timings[name].append((time.perf_counter() - start, tokens))
    engine.shutdown()

    print(f"cpu={cpu_model()!r} model={args.model} requests={args.requests} tokens={args.tokens} rounds={args.rounds}")
    rates = {}
    for name, runs in timings.items():
        seconds = statistics.median(s for s, _ in runs)
        tokens = runs[0][1]
        rates[name] = tokens / seconds
        print(f"{name}: {args.requests / seconds:.2f} requests/s, {tokens / seconds:.1f} tokens/s ({seconds:.2f} s)")
    print(f"ratio={rates['http'] / rates['direct']:.3f}")


if __name__ == "__main__":  # vLLM's engine core is a spawned process: the script must be import-safe
    main()
