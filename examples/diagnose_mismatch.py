"""Where do trainer and engine diverge? Runs the same tokens through the trainer's model (Hugging Face, the weights
a policy exports) and through a vLLM engine, records every layer's activations on both sides, and prints the first
module whose output differs beyond a tolerance, with the size of the difference and the module's parameters.

    uv run examples/diagnose_mismatch.py --bundle LOG_DIR/repro/step_N [--sample 0] [--trainer-backend megatron]
    uv run examples/diagnose_mismatch.py --trainer MODEL_DIR [--engine MODEL_DIR] [--engine-dtype bfloat16]
        [--prompt TEXT] [--new-tokens 16] [--tolerance 1e-4]
        [--temperature T] [--top-k K] [--top-p P] [--tie-rule keep_all|lowest_index]

``--trainer``: the trainer's weights (a model folder, a built-in name, or a run's checkpoint folder, its latest step
or ``step_N``, converted to Hugging Face form as evaluation converts one, from either backend). ``--engine``: what the engine serves (default: the same folder; a
refitted engine's weights can be saved and given here). The engine first generates ``--new-tokens`` greedily after
``--prompt``, so the sequence is one the engine would produce; then both sides run that whole sequence in one
forward pass. Compared in forward order: the embeddings, then per decoder layer its input norm, attention, second
norm, MLP and output (vLLM keeps the residual apart: its layer output is hidden + residual), the final norm and the
logits (an MoE layer adds its router's logits before its MLP, and a divergence there says how many tokens the two
routers send to other experts). A difference counts when ``max |engine - trainer| / max |trainer|`` exceeds ``--tolerance`` (fp32 engines
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
    note: str = ""  # a router's: how many tokens the two sides send to other experts

    def describe(self) -> str:
        params = ", ".join(self.parameters) or "none of its own"
        return (
            f"first divergence: {self.name}: max |engine - trainer| = {self.max_abs:.3g} "
            f"({self.relative:.3g} of the trainer's largest value); its parameters: {params}"
            + (f"; {self.note}" if self.note else "")
        )


def order(num_layers: int, sampler: bool = False, routed: frozenset[int] = frozenset()) -> list[str]:
    """The compared outputs, in forward order; an MoE layer (in ``routed``) adds its router's logits before its MLP."""
    names = ["embed_tokens"]
    for i in range(num_layers):
        subs = [f"layers.{i}.{sub}" for sub in SUBMODULES]
        if i in routed:
            subs.insert(-1, f"layers.{i}.mlp.gate")
        names += [*subs, f"layers.{i}"]
    return [*names, "norm", "logits", *(["sampler"] if sampler else [])]


def routed_layers(model: Any) -> frozenset[int]:
    """The decoder layers whose MLP is a routed mixture of experts (a ``gate`` router; a dense MLP has
    ``gate_proj``)."""
    return frozenset(i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "gate"))


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
    logits: torch.Tensor, token_ids: list[int], positions: list[int], sampling: Sampling
) -> torch.Tensor:
    """The trainer's processed logprob of the token at each of ``positions`` (generated ones), from its logits."""
    from nemo_rl_clone.contract.sampling import TrainingSamplingParams, processed_logits

    params = TrainingSamplingParams(sampling.top_k, sampling.top_p, sampling.temperature, sampling.tie_rule)  # type: ignore[arg-type]
    targets = torch.tensor([token_ids[p] for p in positions])
    rows = logits[[p - 1 for p in positions]].float()
    return processed_logits(rows, targets, params).log_softmax(-1).gather(-1, targets[:, None])


def _hooks(model: Any, captured: dict[str, torch.Tensor], engine: bool) -> list[Any]:
    """Forward hooks on ``model`` (the decoder: ``embed_tokens``, ``layers``, ``norm``) storing each output as
    ``[tokens, hidden]`` fp32 on CPU. vLLM's norms return ``(normed, residual)`` and its layers ``(hidden,
    residual)`` (the residual added by the next norm): a layer's output is their sum."""

    def keep(name: str, is_layer: bool) -> Callable[..., None]:
        def hook(module: Any, args: Any, output: Any) -> None:
            if isinstance(output, tuple):
                output = output[0] + output[1] if engine and is_layer else output[0]
            captured[name] = (
                output.detach().float().reshape(-1, output.shape[-1]).cpu().clone()
            )  # later ops write in place

        return hook

    handles = [model.embed_tokens.register_forward_hook(keep("embed_tokens", False))]
    for i, layer in enumerate(model.layers):
        handles.append(layer.register_forward_hook(keep(f"layers.{i}", True)))
        for sub in SUBMODULES:
            handles.append(getattr(layer, sub).register_forward_hook(keep(f"layers.{i}.{sub}", False)))
        if hasattr(layer.mlp, "gate"):  # an MoE router: its logits first in both libraries' outputs
            handles.append(layer.mlp.gate.register_forward_hook(keep(f"layers.{i}.mlp.gate", False)))
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


# Megatron Core's module for each compared output (its local layer spec; attention and MLP return (output, bias)).
MEGATRON_SUBMODULES = {
    "input_layernorm": "input_layernorm",
    "self_attn": "self_attention",
    "post_attention_layernorm": "pre_mlp_layernorm",
    "mlp": "mlp",
}


def megatron_trainer_activations(model_dir: str, token_ids: list[int]) -> tuple[dict[str, torch.Tensor], Any]:
    """The Megatron backend's outputs for ``token_ids``: the model built as its policy worker builds it (local spec,
    fp32, one rank) from the Hugging Face weights, in a child process (its process group and CPU shims stay there);
    and a weightless Hugging Face model for the parameter names (those of the export, which both backends write)."""
    import subprocess
    import tempfile

    from transformers import AutoConfig, AutoModelForCausalLM

    with tempfile.TemporaryDirectory(prefix="diagnose_megatron_") as tmp:
        out = os.path.join(tmp, "captured.pt")
        command = [sys.executable, __file__, "--megatron-capture", out, "--trainer", model_dir]
        command += ["--token-ids", ",".join(map(str, token_ids))]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            errors = [line.strip() for line in done.stderr.splitlines() if "Error" in line]
            why = errors[-1] if errors else f"exit code {done.returncode} (negative: killed by that signal)"
            raise SystemExit(f"error: --trainer-backend megatron: the Megatron model failed to run: {why}")
        captured = torch.load(out)
    with torch.device("meta"):
        names = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return captured, names


def _megatron_capture(model_dir: str, token_ids: list[int], out: str) -> None:
    """Runs in the child process of `megatron_trainer_activations`."""
    import torch.distributed as dist
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from nemo_rl_clone.models.policy.megatron import converter
    from nemo_rl_clone.models.policy.megatron import model as mmodel
    from nemo_rl_clone.models.policy.megatron.config import MegatronConfig

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    hf_config = AutoConfig.from_pretrained(model_dir)
    shape = converter.model_shape(hf_config)
    parallelism = mmodel.Parallelism(tensor=1, pipeline=1)
    mmodel.init_model_parallel(parallelism)
    config = mmodel.transformer_config(shape, hf_config, MegatronConfig(), "float32", parallelism)
    state: dict[str, torch.Tensor] = {}
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors"):
            state.update(load_file(os.path.join(model_dir, name)))
    gpt, _ = mmodel.build_model(config, shape, hf_config, state)
    gpt.eval()
    captured: dict[str, torch.Tensor] = {}

    def keep(name: str) -> Callable[..., None]:
        def hook(module: Any, args: Any, output: Any) -> None:
            output = output[0] if isinstance(output, tuple) else output
            captured[name] = (
                output.detach().float().reshape(-1, output.shape[-1]).cpu().clone()
            )  # later ops write in place

        return hook

    gpt.embedding.register_forward_hook(keep("embed_tokens"))
    for i, layer in enumerate(gpt.decoder.layers):
        layer.register_forward_hook(keep(f"layers.{i}"))
        for ours, theirs in MEGATRON_SUBMODULES.items():
            getattr(layer, theirs).register_forward_hook(keep(f"layers.{i}.{ours}"))
    gpt.decoder.final_layernorm.register_forward_hook(keep("norm"))
    ids = torch.tensor([token_ids])
    with torch.no_grad():
        captured["logits"] = gpt(ids, torch.arange(len(token_ids))[None], None)[0].float()
    torch.save(captured, out)
    dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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
    for name in order(model.config.num_hidden_layers, "sampler" in engine, routed_layers(model)):
        reference, got = trainer[name], engine[name]
        scale = float(reference.abs().max()) or 1.0
        max_abs = float((got - reference).abs().max())
        if max_abs / scale > tolerance:
            note = _routing_note(reference, got, model.config) if name.endswith(".mlp.gate") else ""
            return Divergence(name, max_abs, max_abs / scale, _parameters(model, name), note)
    return None


def _routing_note(trainer_logits: torch.Tensor, engine_logits: torch.Tensor, config: Any) -> str:
    """How many tokens the two routers send to a different set of experts (top ``num_experts_per_tok``)."""
    k = int(getattr(config, "num_experts_per_tok", 1))
    chosen = [logits.topk(k, dim=-1).indices.sort(dim=-1).values for logits in (trainer_logits, engine_logits)]
    differ = int((chosen[0] != chosen[1]).any(dim=-1).sum())
    return f"{differ} of {trainer_logits.shape[0]} tokens routed to other experts (top {k})"


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
    backend: str = "huggingface",
) -> str:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(trainer_dir)
    prompt_ids = tokenizer(prompt)["input_ids"]
    token_ids, engine = engine_tokens_and_activations(engine_dir, prompt_ids, new_tokens, dtype, sampling)
    positions = list(range(len(prompt_ids), len(token_ids)))
    header = f"{len(token_ids)} tokens ({len(prompt_ids)} prompt)"
    return _compare(trainer_dir, token_ids, positions, engine, dtype, tolerance, sampling, backend, header)


def diagnose_bundle(
    path: str, sample: int, dtype: str, tolerance: float, tie_rule: str = "keep_all", backend: str = "huggingface"
) -> str:
    """A repro bundle's sample: its tokens through the start weights on both sides, and at the sampler the engine's
    logprobs the run recorded (``generation_logprobs``) against the trainer's processing under the run's settings."""
    from nemo_rl_clone.evals.checkpoint import resolve_eval_model
    from nemo_rl_clone.rollout import replay

    bundle = replay.load_bundle(path)
    kind = bundle.start.get("kind")
    if kind == "checkpoint":
        weights = resolve_eval_model(str(bundle.path / "checkpoint")).model_path
    elif kind == "initial_model":
        weights = bundle.config["policy"]["model_name"]
    else:
        raise replay.ReplayError(f"{path}: the weights step {bundle.step} started from were not saved ({kind})")
    from nemo_rl_clone.models.huggingface import resolve_model_path

    weights = resolve_model_path(weights)
    length = int(bundle.batch["input_lengths"][sample])
    token_ids = bundle.batch["input_ids"][sample][:length].tolist()
    positions = torch.nonzero(bundle.batch["token_mask"][sample][:length]).flatten().tolist()
    generation = bundle.config["policy"].get("generation") or {}
    sampling = Sampling(
        float(generation.get("temperature") or 1.0),
        generation.get("top_k") if (generation.get("top_k") or 0) > 0 else None,
        float(generation.get("top_p") or 1.0),
        tie_rule,
    )
    _, engine = engine_tokens_and_activations(weights, token_ids, 0, dtype)
    engine["sampler"] = bundle.batch["generation_logprobs"][sample][positions].float()[:, None]
    header = f"bundle {path}, sample {sample}: {length} tokens ({len(positions)} generated)"
    return _compare(weights, token_ids, positions, engine, dtype, tolerance, sampling, backend, header)


def _compare(
    trainer_dir: str,
    token_ids: list[int],
    positions: list[int],
    engine: dict[str, torch.Tensor],
    dtype: str,
    tolerance: float,
    sampling: Sampling | None,
    backend: str,
    header: str,
) -> str:
    capture = megatron_trainer_activations if backend == "megatron" else trainer_activations
    trainer, model = capture(trainer_dir, token_ids)
    if sampling is not None:
        trainer["sampler"] = trainer_sampled_logprobs(trainer["logits"], token_ids, positions, sampling)
    found = first_divergence(trainer, engine, model, tolerance)
    header += f", trainer {backend}, engine dtype {dtype}, tolerance {tolerance:g}"
    if sampling is not None:
        header += f"\nsampled: {sampling.describe()}"
    if found is None:
        worst = max(
            float((engine[n] - trainer[n]).abs().max()) / (float(trainer[n].abs().max()) or 1.0)
            for n in order(model.config.num_hidden_layers, sampling is not None, routed_layers(model))
        )
        return f"{header}\nno divergence: every output agrees (largest relative difference {worst:.3g})"
    return f"{header}\n{found.describe()}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trainer", help="the trainer's weights: a model, or a run's checkpoint (latest, or step_N)")
    parser.add_argument("--bundle", help="a repro bundle (<log_dir>/repro/step_N): its weights, tokens and settings")
    parser.add_argument("--sample", type=int, default=0, help="the bundle's sample to compare")
    parser.add_argument("--engine", help="the engine's weights (default: --trainer)")
    parser.add_argument("--engine-dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--prompt", default="The capital of France is")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--temperature", type=float, help="sample (seeded) instead of greedy; adds the sampler stage")
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--tie-rule", default="keep_all", choices=("keep_all", "lowest_index"))
    parser.add_argument(
        "--trainer-backend",
        default="huggingface",
        choices=("huggingface", "megatron"),
        help="the trainer's model: Hugging Face's (the DTensor backend's) or Megatron Core's",
    )
    parser.add_argument("--megatron-capture", help=argparse.SUPPRESS)  # the child process's output file
    parser.add_argument("--token-ids", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.megatron_capture:
        _megatron_capture(args.trainer, [int(t) for t in args.token_ids.split(",")], args.megatron_capture)
        return
    sampling = None
    if args.temperature is not None or args.top_k is not None or args.top_p is not None:
        sampling = Sampling(
            1.0 if args.temperature is None else args.temperature, args.top_k, args.top_p or 1.0, args.tie_rule
        )
    if args.bundle:
        from nemo_rl_clone.utils.errors import reporting_user_errors

        with reporting_user_errors():
            dtype, tolerance, backend = args.engine_dtype, args.tolerance, args.trainer_backend
            print(diagnose_bundle(args.bundle, args.sample, dtype, tolerance, args.tie_rule, backend))
        return
    if not args.trainer:
        parser.error("give --trainer (a model) or --bundle (a repro bundle)")
    trainer = _weights(args.trainer)
    engine = _weights(args.engine) if args.engine else trainer
    settings = (args.engine_dtype, args.tolerance, sampling, args.trainer_backend)
    print(diagnose(trainer, engine, args.prompt, args.new_tokens, *settings))


def _weights(name: str) -> str:
    """A model folder, a built-in name, or a run's checkpoint (its latest step, or step_N): converted to Hugging
    Face form as evaluation converts one."""
    from nemo_rl_clone.evals.checkpoint import resolve_eval_model
    from nemo_rl_clone.models.huggingface import resolve_model_path

    return resolve_model_path(resolve_eval_model(name).model_path)


if __name__ == "__main__":
    sys.exit(main())
