"""The HTTP path against direct generation, in one invocation: one async engine (``vllm_cfg.async_engine``) serves
the same batch three times per round: as one direct ``generate`` call (what GRPO's own rollouts do), as concurrent
``/v1/completions`` requests from a real ``openai.AsyncOpenAI`` client to the engine's server, and as the same
requests through the router (`EpisodeRouter`, a Ray actor: what an agent of ``env.agent`` talks to), with
recording on. Every request samples exactly ``--tokens`` tokens (``ignore_eos``), so all paths do the same work.

Per path: the median over ``--rounds`` rounds (after one warm-up round each) of requests/s and generated tokens/s;
then ``ratio=`` (engine server's tokens/s over direct tokens/s) and ``router_ratio=`` (through the router over
direct; the goal is >= 0.8 for both).

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
    import ray
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from nemo_rl_clone.models.generation.config import GenerationConfig, VllmConfig
    from nemo_rl_clone.models.generation.vllm import engine_io
    from nemo_rl_clone.models.generation.vllm.async_engine import AsyncEngine
    from nemo_rl_clone.models.generation.vllm.vllm_generation import start_router
    from nemo_rl_clone.models.huggingface import load_tokenizer, resolve_model_path

    path = resolve_model_path(args.model)
    tokenizer = load_tokenizer(args.model)
    vllm_cfg = VllmConfig(
        async_engine=True, expose_http_server=True, precision="float32", max_model_len=256, enforce_eager=True
    )
    config = GenerationConfig(max_new_tokens=args.tokens, vllm_cfg=vllm_cfg)
    engine = AsyncEngine(engine_io.engine_kwargs(config, path, 0, False))
    url = engine.serve_openai(path, args.model, ray.util.get_node_ip_address(), {})
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    router = start_router([url], "bench")
    router_url = ray.get(router.start.remote())
    prompts = [f"Question {i}: what is {i} + {2 * i}? Think step by step." for i in range(args.requests)]
    token_prompts = [TokensPrompt(prompt_token_ids=tokenizer(p)["input_ids"]) for p in prompts]
    params = SamplingParams(max_tokens=args.tokens, min_tokens=args.tokens, ignore_eos=True, logprobs=0, seed=0)

    def direct() -> int:
        outputs = engine.generate(token_prompts, [params] * len(token_prompts))
        return sum(len(out.outputs[0].token_ids) for out in outputs)

    async def over_http(base_url: str) -> int:
        async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
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

    def http(base_url: str) -> int:
        tokens = asyncio.run(over_http(base_url))
        ids = [f"bench-{i}" for i in range(len(prompts))]
        engine.take_served_calls(ids)  # the records, as a rollout takes them
        ray.get(router.close_episodes.remote(ids))
        return tokens

    paths = {"direct": direct, "http": lambda: http(url), "router": lambda: http(router_url)}
    timings: dict[str, list[tuple[float, int]]] = {name: [] for name in paths}
    for round_index in range(args.rounds + 1):
        for name, run in paths.items():
            start = time.perf_counter()
            tokens = run()
            if round_index:  # round 0 warms both paths up
                timings[name].append((time.perf_counter() - start, tokens))
    engine.shutdown()
    ray.shutdown()

    print(f"cpu={cpu_model()!r} model={args.model} requests={args.requests} tokens={args.tokens} rounds={args.rounds}")
    rates = {}
    for name, runs in timings.items():
        seconds = statistics.median(s for s, _ in runs)
        tokens = runs[0][1]
        rates[name] = tokens / seconds
        print(f"{name}: {args.requests / seconds:.2f} requests/s, {tokens / seconds:.1f} tokens/s ({seconds:.2f} s)")
    print(f"ratio={rates['http'] / rates['direct']:.3f} router_ratio={rates['router'] / rates['direct']:.3f}")


if __name__ == "__main__":  # vLLM's engine core is a spawned process: the script must be import-safe
    main()
