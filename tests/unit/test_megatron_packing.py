"""Sequence packing and context parallelism on the Megatron backend (local layer spec, gloo, no Transformer Engine),
against the same worker on padded rows.

`test_megatron_policy`'s tiny random Llama (4 layers, 4 heads / 2 KV heads, tied embeddings) and batches (8 rows of
width 16, random lengths, prompt and sample masks). The reference is one process on padded rows: logprobs, then
3 Adam steps (the weights after each). Each packed scenario takes the same data as token-bounded packing bins
(several samples per row, as `Policy` shards it) and must give the reference's logprobs (to 2e-6) and weights after
every step (to 1e-5): the only differences are float sums over other shapes and the attention kernel (Megatron's
local attention on padded rows, SDPA per sample when packed).

- ``tp2_sp``: TP=2 with sequence parallelism (each packed row padded to a multiple of 2);
- ``pp2_uneven_recompute``: two pipeline stages of 1 and 3 layers (the packed row's shape travels between them),
  with full activation recomputation (the packed boundaries reach the recomputed attention);
- ``cp2``: context parallelism over 2 ranks (each sample split into 4 chunks, keys and values all-gathered).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.models.policy.config import PolicyConfig
from nemo_rl_clone.utils.config_validation import ConfigError, validate_config
from tests.unit.test_megatron_policy import ROWS, SEQ, make_batches, policy_dict, spawn, tiny_llama_dir

PACKING = {
    "enabled": True,
    "train_mb_tokens": 40,
    "logprob_mb_tokens": 48,
    "algorithm": "modified_first_fit_decreasing",
}
# Measured (fp32): logprobs ≤ 4.8e-7 packed in one process and at PP=2 or CP=2, 9.5e-7 at TP=2 (where TP=2 on
# padded rows already reorders the sums); weights ≤ 7e-7. A sample seeing another, or a chunk at the wrong
# position, moves logprobs by > 0.1.
LOGPROB_ATOL, WEIGHT_ATOL = 2e-6, 1e-5


def config(model_dir: str, packed: bool, tp: int = 1, pp: int = 1, **megatron: Any) -> PolicyConfig:
    section = policy_dict(model_dir, tp, pp, **megatron)
    section["max_total_sequence_length"] = SEQ
    if packed:
        section["sequence_packing"] = PACKING
    return validate_config(section, PolicyConfig)


def packed_shard(data: BatchedDataDict, budget: int) -> tuple[BatchedDataDict, list[int]]:
    """``data`` as `Policy` hands it to every rank of one data-parallel replica: rows sorted and binned."""
    shards, order = data.shard_by_batch_size(
        1,
        batch_size=ROWS,
        sequence_packing_args={
            "input_key": "input_ids",
            "input_lengths_key": "input_lengths",
            "max_tokens_per_microbatch": budget,
            "algorithm": PACKING["algorithm"],
        },
    )
    return shards[0], order


def run(model_dir: str, batches: list[BatchedDataDict], packed: bool, tp: int, pp: int, megatron: dict) -> dict:
    """Logprobs of batch 0 (input row order), then one Adam step per batch; the refit state after each."""
    from nemo_rl_clone.algorithms.loss import NLLLossFn
    from nemo_rl_clone.models.huggingface import load_tokenizer
    from nemo_rl_clone.models.policy.megatron.policy_worker import MegatronPolicyWorker

    worker = MegatronPolicyWorker(config(model_dir, packed, tp, pp, **megatron), load_tokenizer(model_dir), model_dir)
    data, order = packed_shard(batches[0], PACKING["logprob_mb_tokens"]) if packed else (batches[0], list(range(ROWS)))
    logprobs = torch.empty(ROWS, SEQ)
    logprobs[order] = worker.get_logprobs(data)["logprobs"]
    result: dict[str, Any] = {"logprobs": logprobs, "bins": [], "states": []}
    for batch in batches:
        if packed:
            batch, _ = packed_shard(batch, PACKING["train_mb_tokens"])
            result["bins"].append([end - start for start, end in batch.micro_batch_indices[0]])
        worker.train(batch, NLLLossFn(), gbs=ROWS)
        result["states"].append(worker.get_full_state_dict_for_refit())
    worker.shutdown()
    return result


SCENARIOS: dict[str, tuple[int, int, int, dict[str, Any]]] = {  # processes, tp, pp, more megatron_cfg keys
    "tp2_sp": (2, 2, 1, {"sequence_parallel": True}),
    "pp2_uneven_recompute": (2, 1, 2, {"num_layers_in_first_pipeline_stage": 1, "activation_checkpointing": True}),
    "cp2": (2, 1, 1, {"context_parallel_size": 2}),
}


@pytest.fixture(scope="module")
def model_dir(module_tmp_path: Path) -> str:
    return tiny_llama_dir(module_tmp_path)


@pytest.fixture(scope="module")
def batches() -> list[BatchedDataDict]:
    return make_batches()


@pytest.fixture(scope="module")
def reference(model_dir: str, batches: list[BatchedDataDict]) -> dict:
    return spawn(1, run, model_dir, batches, False, 1, 1, {})


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_packed_runs_equal_padded_rows(scenario: str, reference: dict, model_dir: str, batches: list) -> None:
    world, tp, pp, megatron = SCENARIOS[scenario]
    packed = spawn(world, run, model_dir, batches, True, tp, pp, megatron)
    assert all(max(bins) > 1 for bins in packed["bins"]), "every step must pack several samples into a row"
    torch.testing.assert_close(packed["logprobs"], reference["logprobs"], atol=LOGPROB_ATOL, rtol=0)
    for step, (state, expected) in enumerate(zip(packed["states"], reference["states"], strict=True)):
        assert state.keys() == expected.keys()
        for name in state:
            torch.testing.assert_close(state[name], expected[name], atol=WEIGHT_ATOL, rtol=0, msg=f"step {step} {name}")


def test_context_parallelism_needs_packing(model_dir: str) -> None:
    """As in NeMo-RL: Megatron's context parallelism runs packed sequences only; refused in one line otherwise."""
    with pytest.raises(ConfigError, match=r"megatron_cfg\.context_parallel_size: context parallelism on the Megatron"):
        config(model_dir, False, context_parallel_size=2)
