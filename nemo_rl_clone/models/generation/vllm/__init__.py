"""vLLM generation backend: `VllmGeneration` (driver facade) over `VllmGenerationWorker` actors."""

from nemo_rl_clone.models.generation.vllm.vllm_generation import VLLM_WORKER, VllmGeneration

__all__ = ["VLLM_WORKER", "VllmGeneration"]
