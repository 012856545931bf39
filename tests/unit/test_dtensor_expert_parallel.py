"""Expert parallelism on the DTensor backend (``policy.dtensor_cfg.expert_parallel_size``): the built-in tiny
Qwen3-MoE (8 experts, top-2, 2 layers) on 2 gloo processes (no Ray), EP=2 (4 experts per rank) against EP=1 (FSDP2
shards all 8 over both ranks), fp32.

One spawn runs three workers in turn: EP=2 (logprobs with and without a forced routing, the refit state, 3 AdamW
steps with the router loss on, a checkpoint and an HF export after step 1), EP=1 (the same), and EP=1 resumed from
EP=2's checkpoint (steps 2-3). Tolerance 1e-5: the layouts only reorder float sums (measured: logprobs 1.9e-6,
weights after 3 steps 1.5e-6, losses and grad norms equal to print precision). Experts placed on the wrong rank gave
a 0.062 logprob gap; experts' gradients divided by the ``edp`` size only (FSDP's default) instead of the whole
data-parallel size, a grad-norm gap of 0.027.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from nemo_rl_clone.data.interfaces import ROUTED_EXPERTS
from tests.unit.policy_reference import spawned_dtensor_worker, spawned_train_step
from tests.unit.test_megatron_policy import ROWS, make_batches, max_diff, spawn

ATOL = 1e-5
EXPERTS, TOP_K, LAYERS = 8, 2, 2


def _worker(model_dir: str, ep: int, **kwargs: Any) -> Any:
    moe = {"hf_config_overrides": {"router_aux_loss_coef": 0.01}, "router_replay": {"enabled": True}}
    return spawned_dtensor_worker(model_dir, ROWS, {"expert_parallel_size": ep}, moe, **kwargs)


def _step(worker: Any, data: Any) -> dict[str, Any]:
    step = spawned_train_step(worker, data, ROWS)
    step["router_aux_loss"] = step.pop("metrics")["router_aux_loss"]
    return step


def forced_routing(data: Any) -> torch.Tensor:
    """``[B, S, layers, k]`` random distinct experts per token, -1 (the model routes) at each row's first 3 tokens."""
    generator = torch.Generator().manual_seed(5)
    rows, width = data["input_ids"].shape
    picks = [torch.randperm(EXPERTS, generator=generator)[:TOP_K] for _ in range(rows * width * LAYERS)]
    routing = torch.stack(picks).reshape(rows, width, LAYERS, TOP_K).to(torch.int16)
    routing[:, :3] = -1
    return routing


def _straight_run(worker: Any, batches: list, run_dir: str | None) -> dict[str, Any]:
    """Both ranks ask for the logprobs of the whole first batch (so rank 0 returns every row), then 3 steps."""
    forced = batches[0].copy()
    forced[ROUTED_EXPERTS] = forced_routing(batches[0])
    record = {
        "logprobs": worker.get_logprobs(batches[0])["logprobs"],
        "forced_logprobs": worker.get_logprobs(forced)["logprobs"],
        "refit_info": worker.prepare_refit_info(),
        "init_state": worker.get_full_state_dict_for_refit(),
        "steps": [_step(worker, batches[0])],
    }
    if run_dir is not None:
        worker.save_checkpoint(f"{run_dir}/weights", f"{run_dir}/optimizer", save_hf_path=f"{run_dir}/hf_step_1")
    record["steps"] += [_step(worker, batch) for batch in batches[1:]]
    return record


def run_scenarios(model_dir: str, run_dir: str, batches: list) -> dict[str, Any]:
    worker = _worker(model_dir, 2)
    experts = worker.model.model.layers[0].mlp.experts
    record = {
        "ep2_local_experts": experts.gate_up_proj.to_local().shape[0],
        "ep2": _straight_run(worker, batches, run_dir),
    }
    worker.shutdown()
    worker = _worker(model_dir, 1)
    record["ep1"] = _straight_run(worker, batches, None)
    worker.shutdown()
    worker = _worker(model_dir, 1, weights_path=f"{run_dir}/weights", optimizer_path=f"{run_dir}/optimizer")
    record["resumed"] = [_step(worker, batch) for batch in batches[1:]]
    worker.shutdown()
    return record


def _safetensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {name: t for path in sorted(folder.glob("*.safetensors")) for name, t in load_file(path).items()}


def _same_steps(got: list[dict], want: list[dict]) -> None:
    for a, b in zip(got, want, strict=True):
        assert abs(a["loss"] - b["loss"]) <= ATOL
        assert abs(a["grad_norm"] - b["grad_norm"]) <= ATOL
        assert max_diff(a["router_aux_loss"], b["router_aux_loss"]) <= ATOL
        assert max_diff(a["state"], b["state"]) <= ATOL


def test_expert_parallel_trains_checkpoints_and_exports_like_ep1(tmp_path: Path) -> None:
    from nemo_rl_clone.models.huggingface import TINY_QWEN3_MOE, resolve_model_path

    model_dir = resolve_model_path(TINY_QWEN3_MOE)
    record = spawn(2, run_scenarios, model_dir, str(tmp_path), make_batches(), writes=tmp_path)
    ep2, ep1 = record["ep2"], record["ep1"]
    assert record["ep2_local_experts"] == EXPERTS // 2
    # The refit state is whole and per expert, named as on disk (and as vLLM loads it), bit-identical at init.
    on_disk = _safetensors(Path(model_dir))
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in ep2["init_state"]
    assert ep2["init_state"].keys() in (on_disk.keys(), on_disk.keys() - {"lm_head.weight"})  # tied or not
    assert all(torch.equal(t, on_disk[name]) for name, t in ep2["init_state"].items())
    assert {name: info[0] for name, info in ep2["refit_info"].items()} == {
        name: t.shape for name, t in ep2["init_state"].items()
    }
    assert max_diff(ep2["logprobs"], ep1["logprobs"]) <= ATOL
    # Router replay routes through the dispatch: a forced routing moves the logprobs, the same way at both sizes.
    assert max_diff(ep2["forced_logprobs"], ep1["forced_logprobs"]) <= ATOL
    assert max_diff(ep2["forced_logprobs"], ep2["logprobs"]) > 1e-2
    _same_steps(ep2["steps"], ep1["steps"])
    assert max_diff(ep2["steps"][-1]["state"], ep2["init_state"]) > 1e-3, "the steps must move the weights"
    # A DCP checkpoint saved at EP=2 (weights and Adam state) resumes at EP=1 as the straight run continued.
    _same_steps(record["resumed"], ep2["steps"][1:])
    exported = _safetensors(tmp_path / "hf_step_1")
    assert exported.keys() == ep2["steps"][0]["state"].keys()
    assert all(torch.equal(exported[name], t) for name, t in ep2["steps"][0]["state"].items())


def test_layouts_that_do_not_split_are_refused_in_one_line_naming_the_key() -> None:
    from nemo_rl_clone.models.policy.config import DTensorConfig
    from nemo_rl_clone.models.policy.dtensor.expert_parallel import refusal

    key = "policy.dtensor_cfg.expert_parallel_size"
    assert refusal(EXPERTS, 1, 3) is None and refusal(0, 1, 1) is None and refusal(EXPERTS, 2, 4) is None
    assert refusal(0, 2, 2) == f"{key}=2 needs an MoE model (this one has no routed experts); set it to 1"
    assert refusal(EXPERTS, 3, 3) == f"{key}=3 must divide the model's 8 routed experts"
    assert refusal(EXPERTS, 4, 2) == f"{key}=4 must divide the data-parallel size 2 (the policy's workers)"
    assert DTensorConfig(expert_parallel_size=2).check() == []
    assert DTensorConfig(expert_parallel_size=0).check() == [("expert_parallel_size", "must be >= 1, got 0")]
