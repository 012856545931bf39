"""Where do trainer and engine diverge? Runs the same tokens through the trainer's model (Hugging Face, the weights
a policy exports) and through a vLLM engine, records every layer's activations on both sides, and prints the first
module whose output differs beyond a tolerance, with the size of the difference and the module's parameters.

    uv run examples/diagnose_mismatch.py --trainer MODEL_DIR [--engine MODEL_DIR] [--engine-dtype bfloat16]
        [--prompt TEXT] [--new-tokens 16] [--tolerance 1e-4]

``--trainer``: the trainer's weights in Hugging Face form (a model folder, a built-in name, or a checkpoint's
``policy/hf`` export, which both backends write). ``--engine``: what the engine serves (default: the same folder; a
refitted engine's weights can be saved and given here). The engine first generates ``--new-tokens`` greedily after
``--prompt``, so the sequence is one the engine would produce; then both sides run that whole sequence in one
forward pass. Compared in forward order: the embeddings, then per decoder layer its input norm, attention, second
norm, MLP and output (vLLM keeps the residual apart: its layer output is hidden + residual), the final norm and the
logits. A difference counts when ``max |engine - trainer| / max |trainer|`` exceeds ``--tolerance`` (fp32 engines
agree to ~1e-6 here). Llama-style decoders (Llama, Qwen2, Qwen3 and Qwen3-MoE: the module names both libraries
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


def order(num_layers: int) -> list[str]:
    """The compared outputs, in forward order."""
    names = ["embed_tokens"]
    for i in range(num_layers):
        names += [f"layers.{i}.{sub}" for sub in SUBMODULES] + [f"layers.{i}"]
    return [*names, "norm", "logits"]


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
    model_dir: str, prompt_ids: list[int], new_tokens: int, dtype: str
) -> tuple[list[int], dict[str, torch.Tensor]]:
    """The engine's greedy continuation of ``prompt_ids`` and its outputs over the whole sequence."""
    with _engine_in_this_process():
        return _run_engine(model_dir, prompt_ids, new_tokens, dtype)


def _run_engine(
    model_dir: str, prompt_ids: list[int], new_tokens: int, dtype: str
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
    )
    token_ids = list(prompt_ids)
    if new_tokens:
        greedy = SamplingParams(max_tokens=new_tokens, temperature=0.0, detokenize=False)
        out = llm.generate(TokensPrompt(prompt_token_ids=prompt_ids), greedy, use_tqdm=False)
        token_ids += out[0].outputs[0].token_ids
    llm.collective_rpc(_engine_capture, args=(len(token_ids),))  # hooks on, from the next pass
    one = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    llm.generate(TokensPrompt(prompt_token_ids=token_ids), one, use_tqdm=False)
    (captured,) = llm.collective_rpc(_engine_capture, args=(len(token_ids),))
    del llm
    gc.collect()
    return token_ids, captured


def first_divergence(
    trainer: dict[str, torch.Tensor], engine: dict[str, torch.Tensor], model: Any, tolerance: float
) -> Divergence | None:
    """The first output (forward order) where the engine differs from the trainer beyond ``tolerance``."""
    for name in order(model.config.num_hidden_layers):
        reference, got = trainer[name], engine[name]
        scale = float(reference.abs().max()) or 1.0
        max_abs = float((got - reference).abs().max())
        if max_abs / scale > tolerance:
            return Divergence(name, max_abs, max_abs / scale, _parameters(model, name))
    return None


def _parameters(model: Any, name: str) -> list[str]:
    prefix = "lm_head" if name == "logits" else f"model.{name}"
    own = [n for n, _ in model.named_parameters() if n.startswith(f"{prefix}.")]
    if name.startswith("layers.") and name.count(".") == 1:
        return [f"{prefix}.*"]  # the whole layer: its sub-modules were compared first
    return own


def diagnose(trainer_dir: str, engine_dir: str, prompt: str, new_tokens: int, dtype: str, tolerance: float) -> str:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(trainer_dir)
    prompt_ids = tokenizer(prompt)["input_ids"]
    token_ids, engine = engine_tokens_and_activations(engine_dir, prompt_ids, new_tokens, dtype)
    trainer, model = trainer_activations(trainer_dir, token_ids)
    found = first_divergence(trainer, engine, model, tolerance)
    header = f"{len(token_ids)} tokens ({len(prompt_ids)} prompt), engine dtype {dtype}, tolerance {tolerance:g}"
    if found is None:
        worst = max(
            float((engine[n] - trainer[n]).abs().max()) / (float(trainer[n].abs().max()) or 1.0)
            for n in order(model.config.num_hidden_layers)
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
    args = parser.parse_args(argv)
    from nemo_rl_clone.models.huggingface import resolve_model_path

    trainer = resolve_model_path(args.trainer)
    engine = resolve_model_path(args.engine) if args.engine else trainer
    print(diagnose(trainer, engine, args.prompt, args.new_tokens, args.engine_dtype, args.tolerance))


if __name__ == "__main__":
    sys.exit(main())
