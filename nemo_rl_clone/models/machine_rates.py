"""This machine's measured rates at a model's shapes, for the dry run's time plan: a probe of a few seconds, cached.

The probe times the primitives a GRPO step is made of, at the model's own shapes, in this process:

- ``train_gflops``: matmuls of one training microbatch (forward ``X·Wᵀ``, input gradient ``dY·W``, weight gradient
  ``dYᵀ·X``) at the decoder's and the head's widths, FLOP-weighted, in the policy's compute precision;
- ``decode_fixed_s`` and ``decode_row_s``: one decode step's linear layers (every layer's own weights, so they
  stream from memory as in an engine) at 1 row and at ``rows`` rows, as ``fixed + row × rows``, plus, per row, the
  sampler's work over the vocabulary (a softmax, one exponential noise per entry, the arg max, the log-softmax);
- ``memory_gbps``: a streaming read (the KV cache a decode step reads); ``copy_gbps``: a copy into fresh memory (a
  refit's weights); ``engine_prepare_s_per_param``: the engine's preparation of its weights for its GEMM after a
  load (on CPU vLLM prepacks them for oneDNN);
- ``adam_s_per_param``: one fused AdamW step per fp32 parameter.

On a GPU the same probe runs on the device. Results are cached in ``machine_rates.json`` beside the built-in models
(``~/.cache/nemo_rl_clone``, or ``$NRL_CACHE_DIR``) per device, thread count and shapes; an entry is re-measured when it is a day old, or
when a quick matmul (`quick_gflops`, ~0.1 s, run on every use) differs from the one stored with it by more than 20%
(another machine behind the same home directory, or a busy one).
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nemo_rl_clone.models.memory_estimate import PRECISION_BYTES, ModelShape

MAX_AGE_S = 24 * 3600
MAX_DRIFT = 0.2
PROBE_VERSION = 4
# Enough distinct weights to stream from memory rather than a cache, little enough to allocate in a second.
DECODE_WEIGHT_BUDGET_BYTES = 256 * 2**20
# Matrices are probed at most this wide (a large model's layer, a 150k vocabulary): the rate is what is wanted, and
# a decode step's time, proportional to the weights it streams, is scaled up from the probed ones.
PROBE_WIDTH = 4096
HEAD_PROBE_WIDTH = 32768
STREAM_BYTES = 256 * 2**20
ADAM_PROBE_PARAMS = 8 * 2**20


@dataclass(frozen=True)
class MachineRates:
    """What the probe measured (see the module's docstring); ``quick_gflops`` is the drift check's figure."""

    device: str
    threads: int
    train_gflops: float
    decode_fixed_s: float
    decode_row_s: float
    memory_gbps: float
    copy_gbps: float
    engine_prepare_s_per_param: float
    adam_s_per_param: float
    quick_gflops: float
    measured_at: float

    def scaled(self, share: float) -> MachineRates:
        """These rates ``share`` times as fast (an engine over several tensor-parallel devices, taken as ideal)."""
        slow = 1.0 / share
        return MachineRates(
            device=self.device,
            threads=max(1, round(self.threads * share)),
            train_gflops=self.train_gflops * share,
            decode_fixed_s=self.decode_fixed_s * slow,
            decode_row_s=self.decode_row_s * slow,
            memory_gbps=self.memory_gbps * share,
            copy_gbps=self.copy_gbps * share,
            engine_prepare_s_per_param=self.engine_prepare_s_per_param * slow,
            adam_s_per_param=self.adam_s_per_param * slow,
            quick_gflops=self.quick_gflops * share,
            measured_at=self.measured_at,
        )


def cache_path() -> Path:
    from nemo_rl_clone.models.huggingface import cache_dir

    return cache_dir() / "machine_rates.json"


def machine_rates(
    shape: ModelShape, train_precision: str, engine_precision: str, train_tokens: int, rows: int, threads: int = 0
) -> tuple[MachineRates, str]:
    """The rates for these shapes at ``threads`` CPU threads (0: this process's), from the cache when it is fresh,
    else probed now; and where they came from ("cached <age>", "probed now (<reason>)")."""
    import torch

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        device, count = _device()
        key = json.dumps(
            [PROBE_VERSION, device, count, asdict(shape), train_precision, engine_precision, train_tokens, rows]
        )
        entries = _read_cache()
        quick = quick_gflops()
        cached = entries.get(key)
        reason = _stale(cached, quick)
        if cached is not None and reason is None:
            age = time.time() - cached["measured_at"]
            return MachineRates(**cached), f"cached {age / 3600:.1f} h ago, quick check {quick:.0f} GFLOP/s"
        rates = probe(shape, train_precision, engine_precision, train_tokens, rows, quick)
        entries[key] = asdict(rates)
        _write_cache(entries)
        return rates, f"probed now ({reason})"
    finally:
        torch.set_num_threads(before)


def _stale(cached: dict[str, Any] | None, quick: float) -> str | None:
    if cached is None:
        return "no cached entry for these shapes"
    age = time.time() - cached["measured_at"]
    if age > MAX_AGE_S:
        return f"the cached entry is {age / 3600:.0f} h old"
    drift = abs(quick / cached["quick_gflops"] - 1.0)
    if drift > MAX_DRIFT:
        return f"a quick matmul ran {quick:.0f} GFLOP/s against the cached {cached['quick_gflops']:.0f}"
    return None


def probe(
    shape: ModelShape, train_precision: str, engine_precision: str, train_tokens: int, rows: int, quick: float
) -> MachineRates:
    import torch

    device, threads = _device()
    on = "cuda" if device.startswith("cuda") else "cpu"
    train_dtype = _dtype(train_precision)
    engine_dtype = _dtype(engine_precision)
    with torch.no_grad():
        train = _train_gflops(shape, train_tokens, train_dtype, on)
        many = max(rows, 2)
        (one_row, many_rows), prepare = _decode_linear_s(shape, (1, many), engine_dtype, on)
        linear_per_row = max(many_rows - one_row, 0.0) / (many - 1)
        sampler_per_row = _sampler_s(shape.vocab_size, many, on) / many
        memory = _memory_gbps(on)
        copy = _copy_gbps(on)
    return MachineRates(
        device=device,
        threads=threads,
        train_gflops=train,
        decode_fixed_s=one_row - linear_per_row,
        decode_row_s=linear_per_row + sampler_per_row,
        memory_gbps=memory,
        copy_gbps=copy,
        engine_prepare_s_per_param=prepare,
        adam_s_per_param=_adam_s_per_param(on),
        quick_gflops=quick,
        measured_at=time.time(),
    )


def quick_gflops() -> float:
    """One small fp32 matmul's rate: the drift check, cheap enough to run on every dry run."""
    import torch

    on = "cuda" if _device()[0].startswith("cuda") else "cpu"
    a = torch.randn(1024, 1024, device=on)
    b = torch.randn(1024, 1024, device=on)
    return 2 * 1024**3 / _best_s(lambda: a @ b, on, repeats=5) / 1e9


def _device() -> tuple[str, int]:
    import torch

    if torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(0)}", 1
    return f"cpu: {_cpu_model()}", torch.get_num_threads()


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown"


def _dtype(precision: str) -> Any:
    import torch

    return torch.float32 if PRECISION_BYTES.get(precision, 2) == 4 else torch.bfloat16


def _best_s(fn: Callable[[], Any], on: str, repeats: int = 3) -> float:
    """The fastest of ``repeats`` timed calls after one warm-up (the least disturbed by other processes)."""
    import torch

    fn()
    best = float("inf")
    for _ in range(repeats):
        if on == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if on == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def _layer_widths(shape: ModelShape) -> list[tuple[int, int]]:
    """(in, out) of one decoder layer's linear layers: q, k, v, o, then the gated MLP's gate, up and down."""
    h = shape.hidden_size
    heads = shape.num_attention_heads or 1
    head_dim = shape.head_dim or h // heads
    q = heads * head_dim
    kv = (shape.num_key_value_heads or heads) * head_dim
    i = shape.intermediate_size
    return [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]


def _train_gflops(shape: ModelShape, tokens: int, dtype: Any, on: str) -> float:
    import torch

    tokens = max(16, min(tokens, 2048))
    widths = {(min(h, PROBE_WIDTH), min(o, PROBE_WIDTH)) for h, o in _layer_widths(shape)}
    flops = seconds = 0.0
    for fan_in, fan_out in widths:
        x = torch.randn(tokens, fan_in, dtype=dtype, device=on)
        w = torch.randn(fan_out, fan_in, dtype=dtype, device=on)
        dy = torch.randn(tokens, fan_out, dtype=dtype, device=on)
        for a, b in ((x, w.t()), (dy, w), (dy.t(), x)):
            flops += 2 * a.shape[0] * a.shape[1] * b.shape[1]
            seconds += _best_s(functools.partial(torch.matmul, a, b), on, repeats=2)
    return flops / seconds / 1e9


def _decode_linear_s(
    shape: ModelShape, row_counts: tuple[int, ...], dtype: Any, on: str
) -> tuple[tuple[float, ...], float]:
    """One decode step's linear layers at each of ``row_counts`` rows (as many layers' own weights as the budget holds, scaled to
    all layers, plus the head), and the seconds per weight the engine takes to prepare its weights for its GEMM. On
    CPU through vLLM's own GEMM (oneDNN, the weights prepacked, as its engine runs them) when vLLM is installed,
    else torch's (nothing to prepare)."""
    import torch

    true_widths = _layer_widths(shape)
    widths = [(min(i, PROBE_WIDTH), min(o, PROBE_WIDTH)) for i, o in true_widths]
    layer_scale = sum(i * o for i, o in true_widths) / sum(i * o for i, o in widths)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    layer_bytes = sum(i * o for i, o in widths) * itemsize
    copies = max(1, min(shape.num_layers, DECODE_WEIGHT_BUDGET_BYTES // max(layer_bytes, 1)))
    linear = _engine_linear(on)
    raw = [[torch.randn(o, i, dtype=dtype, device=on) for i, o in widths] for _ in range(copies)]
    hidden = min(shape.hidden_size, PROBE_WIDTH)
    vocab = min(shape.vocab_size, HEAD_PROBE_WIDTH)
    head_scale = shape.vocab_size * shape.hidden_size / (vocab * hidden)
    raw_head = torch.randn(vocab, hidden, dtype=dtype, device=on)
    start = time.perf_counter()  # the engine prepares its weights so after every load (a refit too)
    layers = [[linear(w) for w in layer] for layer in raw]
    head = linear(raw_head)
    prepare_s = time.perf_counter() - start
    weights = sum(w.numel() for layer in raw for w in layer) + raw_head.numel()

    def step_s(rows: int) -> float:
        inputs = {i: torch.randn(rows, i, dtype=dtype, device=on) for i, _ in widths} | {
            hidden: torch.randn(rows, hidden, dtype=dtype, device=on)
        }

        def decoder() -> None:
            for layer in layers:
                for (fan_in, _), apply in zip(widths, layer, strict=True):
                    apply(inputs[fan_in])

        per_layer = _best_s(decoder, on) / copies * layer_scale
        return per_layer * shape.num_layers + _best_s(lambda: head(inputs[hidden]), on) * head_scale

    return tuple(step_s(rows) for rows in row_counts), prepare_s / weights


def _engine_linear(on: str) -> Callable[[Any], Callable[[Any], Any]]:
    """weight [out, in] -> (x -> x·Wᵀ), as the engine computes it."""
    import torch.nn.functional as F

    if on == "cpu":
        try:
            from vllm import _custom_ops as ops

            if ops._supports_onednn:

                def prepacked(w: Any) -> Callable[[Any], Any]:
                    try:
                        handler = ops.create_onednn_mm(w.t(), 32)
                    except RuntimeError:  # e.g. bf16 on a CPU without AVX-512: vLLM falls back to torch's linear
                        return lambda x: F.linear(x, w)
                    return lambda x: ops.onednn_mm(handler, x, None)

                return prepacked
        except (ImportError, AttributeError, RuntimeError):
            pass

    def plain(w: Any) -> Callable[[Any], Any]:
        return lambda x: F.linear(x, w)

    return plain


def _sampler_s(vocab: int, rows: int, on: str) -> float:
    """vLLM's random sampling per step: softmax, an exponential noise per entry, the arg max, and the sampled
    token's log-probability."""
    import torch

    logits = torch.randn(rows, vocab, device=on)

    def sample() -> None:
        probs = logits.softmax(-1)
        token = probs.div_(torch.empty_like(probs).exponential_()).argmax(-1, keepdim=True)
        logits.log_softmax(-1).gather(-1, token)

    return _best_s(sample, on)


def _memory_gbps(on: str) -> float:
    import torch

    data = torch.ones(STREAM_BYTES // 4, device=on)
    return STREAM_BYTES / _best_s(data.sum, on) / 1e9


def _copy_gbps(on: str) -> float:
    import torch

    source = torch.ones(STREAM_BYTES // 4, device=on)
    return STREAM_BYTES / _best_s(source.clone, on) / 1e9  # into fresh memory, as a refit's buffers are


def _adam_s_per_param(on: str) -> float:
    import torch

    param = torch.nn.Parameter(torch.randn(ADAM_PROBE_PARAMS, device=on))
    param.grad = torch.randn_like(param)
    optimizer = torch.optim.AdamW([param], lr=1e-5)
    return _best_s(optimizer.step, on, repeats=2) / ADAM_PROBE_PARAMS


def _read_cache() -> dict[str, dict[str, Any]]:
    try:
        entries = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def _write_cache(entries: dict[str, dict[str, Any]]) -> None:
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(entries, indent=1))
        temporary.replace(path)
    except OSError:
        pass  # a read-only home: the plan is still printed, the next dry run probes again
