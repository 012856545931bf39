"""Where do trainer and engine diverge? Runs the same tokens through the trainer's model (Hugging Face, the weights
a policy exports) and through a vLLM engine, records every layer's activations on both sides, and prints the first
module whose output differs beyond a tolerance, with the size of the difference and the module's parameters.

    uv run examples/diagnose_mismatch.py --trainer MODEL_DIR [--engine MODEL_DIR] [--engine-dtype bfloat16]
        [--prompt TEXT] [--new-tokens 16] [--tolerance 1e-4]
        [--temperature T] [--top-k K] [--top-p P] [--tie-rule keep_all|lowest_index]

``--trainer``: the trainer's weights in Hugging Face form (a model folder, a built-in name, or a checkpoint's
``policy/hf`` export, which both backends write). ``--engine``: what the engine serves (default: the same folder; a
refitted engine's weights can be saved and given here). The engine first generates ``--new-tokens`` greedily after
``--prompt``, so the sequence is one the engine would produce; then both sides run that whole sequence in one
forward pass. Compared in forward order: the embeddings, then per decoder layer its input norm, attention, second
norm, MLP and output (vLLM keeps the residual apart: its layer output is hidden + residual), the final norm and the
logits. A difference counts when ``max |engine - trainer| / max |trainer|`` exceeds ``--tolerance`` (fp32 engines
agree to ~1e-6 here). With sampling settings (``--temperature``/``--top-k``/``--top-p``) the engine samples instead
(seeded) and reports each sampled token's processed logprob; the last stage, ``sampler``, compares those with the
trainer's processing of its own logits (`contract.sampling.processed_logits`, under ``--tie-rule``: which tokens
tied at the top-k / top-p boundary stay), so a processing rule that differs shows there while every tensor before it
agrees. Llama-style decoders (Llama, Qwen2, Qwen3 and Qwen3-MoE: the module names both libraries
share).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

SUBMODULES = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")


@dataclass
class Divergence:
    name: str  # e.g. "layers.1.mlp"
    max_abs: float
    relative: float
    parameters: list[str]

    def describe(self) -> str:
        params = ", ".join(self.parameters) or "none of its own"
        return (
            f"first divergence: {self.name}: max |engine - trainer| = {self.max_abs:.3g} "
            f"({self.relative:.3g} of the trainer's largest value); its parameters: {params}"
        )


def order(num_layers: int, sampler: bool = False) -> list[str]:
    """The compared outputs, in forward order."""
    names = ["embed_tokens"]
    for i in range(num_layers):
        names += [f"layers.{i}.{sub}" for sub in SUBMODULES] + [f"layers.{i}"]
    return [*names, "norm", "logits", *(["sampler"] if sampler else [])]


@dataclass(frozen=True)
class Sampling:
    """The engine's sampling settings and the trainer's rule for ties at the top-k / top-p boundary."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    tie_rule: str = "keep_all"

    def vllm(self, max_tokens: int) -> Any:
        from vllm import SamplingParams

        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_k=self.top_k or 0,
            top_p=self.top_p,
            logprobs=0,
            seed=0,
            detokenize=False,
        )

    def describe(self) -> str:
        return f"temperature {self.temperature:g}, top-k {self.top_k}, top-p {self.top_p:g}; trainer's tie rule {self.tie_rule}"


def trainer_sampled_logprobs(
    logits: torch.Tensor, token_ids: list[int], prompt_len: int, sampling: Sampling
) -> torch.Tensor:
    """The trainer's processed logprob of each generated token (positions from ``prompt_len``), from its logits."""
    from nemo_rl_clone.contract.sampling import TrainingSamplingParams, processed_logits

    params = TrainingSamplingParams(sampling.top_k, sampling.top_p, sampling.temperature, sampling.tie_rule)  # type: ignore[arg-type]
    targets = torch.tensor(token_ids[prompt_len:])
    rows = logits[prompt_len - 1 : len(token_ids) - 1].float()
    return processed_logits(rows, targets, params).log_softmax(-1).gather(-1, targets[:, None])


def _hooks(model: Any, captured: dict[str, torch.Tensor], engine: bool) -> list[Any]:
    """Forward hooks on ``model`` (the decoder: ``embed_tokens``, ``layers``, ``norm``) storing each output as
    ``[tokens, hidden]`` fp32 on CPU. vLLM's norms return ``(normed, residual)`` and its layers ``(hidden,
    residual)`` (the residual added by the next norm): a layer's output is their sum."""

    def keep(name: str, is_layer: bool) -> Callable[..., None]:
        def hook(module: Any, args: Any, output: Any) -> None:
            if isinstance(output, tuple):
                output = output[0] + output[1] if engine and is_layer else output[0]
            captured[name] = output.detach().float().reshape(-1, output.shape[-1]).cpu()

        return hook

    handles = [model.embed_tokens.register_forward_hook(keep("embed_tokens", False))]
    for i, layer in enumerate(model.layers):
        handles.append(layer.register_forward_hook(keep(f"layers.{i}", True)))
        for sub in SUBMODULES:
            handles.append(getattr(layer, sub).register_forward_hook(keep(f"layers.{i}.{sub}", False)))
    handles.append(model.norm.register_forward_hook(keep("norm", False)))
    return handles


def trainer_activations(model_dir: str, token_ids: list[int]) -> tuple[dict[str, torch.Tensor], Any]:
    """The Hugging Face model's outputs for ``token_ids`` (fp32), and the model (for parameter names)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    captured: dict[str, torch.Tensor] = {}
    handles = _hooks(model.model, captured, engine=False)
    with torch.no_grad():
        captured["logits"] = model(input_ids=torch.tensor([token_ids])).logits[0].float()
    for handle in handles:
        handle.remove()
    return captured, model


def _engine_capture(worker: Any, token_count: int) -> dict[str, torch.Tensor]:
    """Runs in the engine's worker: installs the hooks once; returns the last full-sequence pass's outputs."""
    model = worker.model_runner.model
    if not hasattr(worker, "_mismatch_captures"):
        worker._mismatch_captures = {}
        worker._mismatch_hooks = _hooks(model.model, worker._mismatch_captures, engine=True)
        return {}
    # the pass may pad the token count; its first token_count rows are the sequence
    captured = {name: t[:token_count] for name, t in worker._mismatch_captures.items()}
    head = model.lm_head.weight.detach().float().cpu()  # the engine's own head (tied: its embedding)
    captured["logits"] = captured["norm"] @ head.T
    return captured


@contextlib.contextmanager
def _engine_in_this_process() -> Iterator[None]:
    """The engine's core in this process (its worker's modules are reachable) and eager, no torch.compile (hooks
    see every module); both restored after."""
    before = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"), torch._dynamo.config.disable
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    torch._dynamo.config.disable = True
    try:
        yield
    finally:
        if before[0] is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = before[0]
        torch._dynamo.config.disable = before[1]


def engine_tokens_and_activations(
    model_dir: str, prompt_ids: list[int], new_tokens: int, dtype: str, sampling: Sampling | None = None
) -> tuple[list[int], dict[str, torch.Tensor]]:
    """The engine's continuation of ``prompt_ids`` (greedy, or sampled under ``sampling``: then ``captured``'s
    ``"sampler"`` holds each sampled token's processed logprob) and its outputs over the whole sequence."""
    with _engine_in_this_process():
        return _run_engine(model_dir, prompt_ids, new_tokens, dtype, sampling)


def _run_engine(
    model_dir: str, prompt_ids: list[int], new_tokens: int, dtype: str, sampling: Sampling | None
) -> tuple[list[int], dict[str, torch.Tensor]]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model_dir,
        dtype=dtype,
        enforce_eager=True,
        enable_prefix_caching=False,  # every position of the sequence is computed in the pass we read
        max_model_len=len(prompt_ids) + new_tokens + 8,
        kv_cache_memory_bytes=64 << 20,
        seed=0,
        logprobs_mode="processed_logprobs",  # a sampled token's logprob under temperature, top-k and top-p
    )
    token_ids = list(prompt_ids)
    sampled: list[float] = []
    if new_tokens:
        params = (
            sampling.vllm(new_tokens)
            if sampling is not None
            else SamplingParams(max_tokens=new_tokens, temperature=0.0, detokenize=False)
        )
        out = llm.generate(TokensPrompt(prompt_token_ids=prompt_ids), params, use_tqdm=False)
        completion = out[0].outputs[0]
        token_ids += completion.token_ids
        if sampling is not None:
            sampled = [
                step[token].logprob for step, token in zip(completion.logprobs, completion.token_ids, strict=True)
            ]
    llm.collective_rpc(_engine_capture, args=(len(token_ids),))  # hooks on, from the next pass
    one = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    llm.generate(TokensPrompt(prompt_token_ids=token_ids), one, use_tqdm=False)
    (captured,) = llm.collective_rpc(_engine_capture, args=(len(token_ids),))
    if sampled:
        captured["sampler"] = torch.tensor(sampled)[:, None]
    del llm
    gc.collect()
    return token_ids, captured


def first_divergence(
    trainer: dict[str, torch.Tensor], engine: dict[str, torch.Tensor], model: Any, tolerance: float
) -> Divergence | None:
    """The first output (forward order) where the engine differs from the trainer beyond ``tolerance``."""
    for name in order(model.config.num_hidden_layers, sampler="sampler" in engine):
        reference, got = trainer[name], engine[name]
        scale = float(reference.abs().max()) or 1.0
        max_abs = float((got - reference).abs().max())
        if max_abs / scale > tolerance:
            return Divergence(name, max_abs, max_abs / scale, _parameters(model, name))
    return None


def _parameters(model: Any, name: str) -> list[str]:
    if name == "sampler":
        return []  # a processing rule, not weights
    prefix = "lm_head" if name == "logits" else f"model.{name}"
    own = [n for n, _ in model.named_parameters() if n.startswith(f"{prefix}.")]
    if name.startswith("layers.") and name.count(".") == 1:
        return [f"{prefix}.*"]  # the whole layer: its sub-modules were compared first
    return own


def diagnose(
    trainer_dir: str,
    engine_dir: str,
    prompt: str,
    new_tokens: int,
    dtype: str,
    tolerance: float,
    sampling: Sampling | None = None,
) -> str:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(trainer_dir)
    prompt_ids = tokenizer(prompt)["input_ids"]
    token_ids, engine = engine_tokens_and_activations(engine_dir, prompt_ids, new_tokens, dtype, sampling)
    trainer, model = trainer_activations(trainer_dir, token_ids)
    if sampling is not None:
        trainer["sampler"] = trainer_sampled_logprobs(trainer["logits"], token_ids, len(prompt_ids), sampling)
    found = first_divergence(trainer, engine, model, tolerance)
    header = f"{len(token_ids)} tokens ({len(prompt_ids)} prompt), engine dtype {dtype}, tolerance {tolerance:g}"
    if sampling is not None:
        header += f"\nsampled: {sampling.describe()}"
    if found is None:
        worst = max(
            float((engine[n] - trainer[n]).abs().max()) / (float(trainer[n].abs().max()) or 1.0)
            for n in order(model.config.num_hidden_layers, sampler=sampling is not None)
        )
        return f"{header}\nno divergence: every output agrees (largest relative difference {worst:.3g})"
    return f"{header}\n{found.describe()}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trainer", required=True, help="the trainer's weights, Hugging Face form")
    parser.add_argument("--engine", help="the engine's weights (default: --trainer)")
    parser.add_argument("--engine-dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--prompt", default="The capital of France is")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--temperature", type=float, help="sample (seeded) instead of greedy; adds the sampler stage")
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--tie-rule", default="keep_all", choices=("keep_all", "lowest_index"))
    args = parser.parse_args(argv)
    sampling = None
    if args.temperature is not None or args.top_k is not None or args.top_p is not None:
        sampling = Sampling(
            1.0 if args.temperature is None else args.temperature, args.top_k, args.top_p or 1.0, args.tie_rule
        )
    from nemo_rl_clone.models.huggingface import resolve_model_path

    trainer = resolve_model_path(args.trainer)
    engine = resolve_model_path(args.engine) if args.engine else trainer
    print(diagnose(trainer, engine, args.prompt, args.new_tokens, args.engine_dtype, args.tolerance, sampling))


if __name__ == "__main__":
    sys.exit(main())
