"""vLLM generation backend: `VllmGeneration` (driver facade) over `VllmGenerationWorker` actors; `VllmConfig`,
NeMo-RL's dict form of a vLLM ``policy.generation`` section (`config`)."""

from nemo_rl_clone.models.generation.vllm.config import VllmConfig
from nemo_rl_clone.models.generation.vllm.vllm_generation import VLLM_WORKER, VllmGeneration

__all__ = ["VLLM_WORKER", "VllmConfig", "VllmGeneration"]
