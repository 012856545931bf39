"""vLLM generation backend: `VllmGeneration` (driver facade) over `VllmGenerationWorker` actors.

The names load on first use: an engine actor imports ``vllm_worker`` through this package and must not pay for the
driver's facade (which loads transformers' model classes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_rl_clone.utils.lazy_exports import lazy_getattr

if TYPE_CHECKING:
    from nemo_rl_clone.models.generation.vllm.vllm_generation import VLLM_WORKER, VllmGeneration

__all__ = ["VLLM_WORKER", "VllmGeneration"]

__getattr__ = lazy_getattr(__name__, {"VLLM_WORKER": "vllm_generation", "VllmGeneration": "vllm_generation"})
