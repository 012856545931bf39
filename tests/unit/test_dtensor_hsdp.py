"""HSDP on the DTensor backend (``policy.dtensor_cfg.dp_replicate_size``): the built-in tiny Llama on 2 gloo
processes (no Ray), 2 replica groups of 1 shard (each rank holds a whole copy, gradients all-reduced across the
groups) against plain FSDP2 over both ranks, fp32, 2 AdamW steps; then plain FSDP2 resumed from HSDP's checkpoint.

Tolerance 1e-6 on losses and weights (measured: losses equal, weights 1.2e-7 after 2 steps), 2e-5 relative on grad
norms (measured 1.0e-5: the norm's fp32 sum over the tied embedding runs in another order). Groups that each stepped
on their own half of the batch (no all-reduce across them) would take other Adam steps from step 1 on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.unit.policy_reference import spawned_dtensor_worker, spawned_train_step
from tests.unit.test_megatron_policy import ROWS, make_batches, max_diff, spawn

ATOL = 1e-6


def _worker(model_dir: str, replicas: int, **kwargs: Any) -> Any:
    return spawned_dtensor_worker(model_dir, ROWS, {"dp_replicate_size": replicas}, **kwargs)


def _step(worker: Any, data: Any) -> dict[str, Any]:
    return spawned_train_step(worker, data, ROWS)


def run_scenarios(model_dir: str, run_dir: str, batches: list) -> dict[str, Any]:
    worker = _worker(model_dir, 2)
    weight = worker.model.model.layers[0].mlp.up_proj.weight
    record: dict[str, Any] = {
        "hsdp_layout": (tuple(weight.device_mesh.shape), [str(p) for p in weight.placements]),
        "hsdp_local_equals_full": weight.to_local().shape == weight.shape,
        "hsdp": [_step(worker, batches[0])],
    }
    worker.save_checkpoint(f"{run_dir}/weights", f"{run_dir}/optimizer")
    record["hsdp"].append(_step(worker, batches[1]))
    worker.shutdown()
    worker = _worker(model_dir, 1)
    record["fsdp"] = [_step(worker, batch) for batch in batches[:2]]
    worker.shutdown()
    worker = _worker(model_dir, 1, weights_path=f"{run_dir}/weights", optimizer_path=f"{run_dir}/optimizer")
    record["resumed"] = _step(worker, batches[1])
    worker.shutdown()
    return record


def test_hsdp_trains_and_checkpoints_like_fsdp(tmp_path: Path) -> None:
    from nemo_rl_clone.models.huggingface import TINY_LLAMA, resolve_model_path

    record = spawn(2, run_scenarios, resolve_model_path(TINY_LLAMA), str(tmp_path), make_batches(), writes=tmp_path)
    # Replicated over the 2 groups, sharded over each group's 1 rank: every rank holds the whole weight.
    assert record["hsdp_layout"] == ((2, 1), ["R", "S(0)"])
    assert record["hsdp_local_equals_full"]
    for got, want in zip(record["hsdp"], record["fsdp"], strict=True):
        assert abs(got["loss"] - want["loss"]) <= ATOL
        # The norm sums 6M squared fp32 gradients (the tied embedding) in another order: 1.0e-5 relative measured.
        assert abs(got["grad_norm"] - want["grad_norm"]) <= 2e-5 * want["grad_norm"]
        assert max_diff(got["state"], want["state"]) <= ATOL
    resumed, want = record["resumed"], record["fsdp"][1]
    assert abs(resumed["loss"] - want["loss"]) <= ATOL
    assert max_diff(resumed["state"], want["state"]) <= ATOL
