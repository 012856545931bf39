"""The GPU kit's sharded-engine check (tools/gpu_checks.sh): one vLLM engine of tensor_parallel_size = 2 over two
GPUs (vLLM's multi-process executor), refit over NCCL from a trainer stand-in on a GPU of its own process.

The tiny random Llama (4 heads, 2 KV heads), fp32: the engine's logprobs of its greedy continuations equal a plain
Hugging Face fp32 forward of the same weights to `LOGPROB_ATOL` before a refit and after a collective one (and
differ from other weights by far more). The same scenario over gloo on CPU is
tests/unit/test_vllm_engine_parallel.py.

Needs two CUDA devices, Ray and vLLM (the project's GPU environment); skips saying which is missing otherwise.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch


def missing_for_the_check() -> str | None:
    """Why this machine cannot run the check, or None."""
    reasons = []
    if torch.cuda.device_count() < 2:
        reasons.append(f"needs two GPUs, this machine has {torch.cuda.device_count()}")
    absent = [name for name in ("ray", "vllm") if importlib.util.find_spec(name) is None]
    if absent:
        reasons.append(f"needs {' and '.join(absent)} (the project's GPU environment), not installed here")
    return "; ".join(reasons) or None


MISSING = missing_for_the_check()
if MISSING is not None:
    pytest.skip(f"TP = 2 engine with NCCL refit: {MISSING}", allow_module_level=True)

# Only where the check runs: Ray and vLLM are absent from the lent GPU machine.
import os  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from typing import Any  # noqa: E402

import ray  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster  # noqa: E402
from nemo_rl_clone.distributed.weight_transfer import WeightTransferGroup, broadcast_state_dict  # noqa: E402
from nemo_rl_clone.models.generation.vllm import VllmGeneration  # noqa: E402
from nemo_rl_clone.models.generation.vllm.vllm_generation import engine_bundle_groups, engine_gpu_ids  # noqa: E402
from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer, resolve_model_path  # noqa: E402
from nemo_rl_clone.rollout.refit import init_refit_collective, prepare_refit, refit_policy_generation  # noqa: E402
from tests.unit.hf_weight_source import HFPolicyStandIn, checkpoint_state, perturbed_model  # noqa: E402
from tests.unit.test_vllm_engine_parallel import engine_vs_reference_gap  # noqa: E402
from tests.unit.vllm_test_utils import LOGPROB_ATOL, tiny_config  # noqa: E402

pytestmark = pytest.mark.gpu


@ray.remote(num_cpus=0, runtime_env={"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}})
class CudaWeightSource:
    """Train rank 0 stand-in on GPU ``gpu_id``: perturbed weights there, broadcast over NCCL."""

    def __init__(self, model_path: str, gpu_id: str) -> None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu_id  # before CUDA starts in this process
        self.model_path = model_path
        self.state: dict[str, torch.Tensor] = {}
        self.group: WeightTransferGroup | None = None

    def set_seed(self, seed: int) -> None:
        state = checkpoint_state(perturbed_model(self.model_path, seed))
        self.state = {name: tensor.to("cuda") for name, tensor in state.items()}

    def prepare_refit_info(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        return {name: (tensor.shape, tensor.dtype) for name, tensor in self.state.items()}

    def init_collective(self, address: str, port: int, world_size: int, timeout_s: float) -> None:
        self.group = WeightTransferGroup(address, port, 0, world_size, torch.device("cuda", 0), timeout_s)

    def broadcast(self, bucket_bytes: int) -> int:
        assert self.group is not None
        return broadcast_state_dict(self.group, self.state, bucket_bytes)


class CudaPolicyStandIn(HFPolicyStandIn):
    """`HFPolicyStandIn`'s refit methods over a `CudaWeightSource` (collective refits only)."""

    def __init__(self, model_path: str, seed: int, gpu_id: str) -> None:
        self.actor = CudaWeightSource.remote(model_path, gpu_id)
        ray.get(self.actor.set_seed.remote(seed))


@pytest.fixture(scope="module")
def cluster(ray_local: None) -> Iterator[RayVirtualCluster]:
    cluster = RayVirtualCluster([2], use_gpus=True, num_gpus_per_node=2, name="vllm-tp2-gpu")
    yield cluster
    cluster.shutdown()


def test_a_tp2_engine_on_two_gpus_serves_exact_logprobs_after_an_nccl_refit(cluster: RayVirtualCluster) -> None:
    model_path = resolve_model_path(TINY_LLAMA)
    tokenizer: Any = load_tokenizer(TINY_LLAMA)
    tokenizer.padding_side = "right"
    config = tiny_config()
    config.vllm_cfg.tensor_parallel_size = 2
    # The engine actor receives the broadcast on its first GPU; NCCL needs the trainer on another: the second.
    (engine_gpus,) = engine_gpu_ids(cluster, engine_bundle_groups(cluster, 2))
    generation = VllmGeneration(cluster, config, TINY_LLAMA, name_prefix="vllm-tp2-gpu")
    trainer = CudaPolicyStandIn(model_path, seed=1, gpu_id=engine_gpus[1])
    try:
        assert generation.dp_size == 1
        base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        assert engine_vs_reference_gap(generation, tokenizer, base) <= LOGPROB_ATOL
        prepare_refit(trainer, generation)
        init_refit_collective(trainer, generation, cluster, timeout_s=120.0)
        ray.get(trainer.actor.set_seed.remote(12))
        refit_policy_generation(trainer, generation, colocated=False)
        assert engine_vs_reference_gap(generation, tokenizer, perturbed_model(model_path, 12)) <= LOGPROB_ATOL
        assert engine_vs_reference_gap(generation, tokenizer, base) > 1e-2  # the refit changed what it serves
    finally:
        trainer.shutdown()
        generation.shutdown()
