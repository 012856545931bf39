"""`DTensorPolicyWorker` on one CUDA GPU, in a spawned process without Ray, against the plain single-process
Hugging Face + AdamW reference on CPU (`tests.unit.policy_reference`).

Ray-free on purpose: the GPU machines these run on have torch and transformers but no Ray (the Ray-backed GPU tests
in test_policy_dtensor.py need both). Each scenario is one worker doing what GRPO does with it: logprobs, a training
step, an offload/refit/reload cycle, reference logprobs, a second step. Skipped without CUDA (CI never has one).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer, resolve_model_path
from nemo_rl_clone.models.policy.config import SequencePackingConfig
from tests.unit.policy_reference import LR, make_batch, max_state_diff, policy_config, reference_run
from tests.unit.test_megatron_policy import spawn

pytestmark = pytest.mark.gpu

# GPU kernels (cuBLAS, SDPA) sum in other orders than the CPU reference's: fp32 agreement is ~1e-6..1e-5.
GPU_ATOL = 1e-4


def run_worker(model_path: str, batch: BatchedDataDict, overrides: dict[str, Any]) -> dict[str, Any]:
    """In the spawned process: one worker through a GRPO-like cycle; everything returned on CPU."""
    from nemo_rl_clone.algorithms.loss import NLLLossFn
    from nemo_rl_clone.models.policy.dtensor.policy_worker import DTensorPolicyWorker

    def cpu_state(state: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
        assert state is not None, "rank 0 of a world of 1 holds the full state dict"
        return {name: tensor.detach().to("cpu", copy=True) for name, tensor in state.items()}

    def step() -> dict[str, torch.Tensor]:
        result = worker.train(batch, NLLLossFn())
        return {"loss": result["global_loss"][0].cpu(), "grad_norm": result["grad_norm"][0].cpu()}

    model_path = resolve_model_path(model_path)
    worker = DTensorPolicyWorker(policy_config(model_path, **overrides), load_tokenizer(model_path), model_path)
    record: dict[str, Any] = {"device": str(worker.device), "logprobs": worker.get_logprobs(batch)["logprobs"].cpu()}
    record["step1"] = step()
    worker.prepare_for_lp_inference()  # where a logprob pass finds the optimizer state
    record["optimizer_devices_in_logprob_pass"] = {
        str(value.device)
        for state in worker.optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor) and value.dim() > 0
    }
    worker.prepare_for_training()
    worker.offload_before_refit()
    record["refit_state"] = cpu_state(worker.get_full_state_dict_for_refit())
    worker.offload_after_refit()
    worker.prepare_for_lp_inference()
    record["reference_logprobs"] = worker.get_reference_policy_logprobs(batch)["reference_logprobs"].cpu()
    worker.prepare_for_training()
    record["step2"] = step()
    record["state2"] = cpu_state(worker.get_full_state_dict_for_refit())
    worker.shutdown()
    return record


@pytest.fixture(scope="module")
def batch() -> BatchedDataDict:
    return make_batch(load_tokenizer(resolve_model_path(TINY_LLAMA)))


@pytest.fixture(scope="module")
def reference(batch: BatchedDataDict) -> dict[str, Any]:
    return reference_run(resolve_model_path(TINY_LLAMA), batch, steps=2)


def on_gpu(batch: BatchedDataDict, **overrides: Any) -> dict[str, Any]:
    record = spawn(1, run_worker, TINY_LLAMA, batch, overrides, cuda=True)
    assert record["device"] == "cuda:0"
    return record


def assert_matches_reference(record: dict[str, Any], reference: dict[str, Any]) -> None:
    torch.testing.assert_close(record["logprobs"], reference["initial_logprobs"], atol=GPU_ATOL, rtol=0)
    torch.testing.assert_close(record["reference_logprobs"], reference["initial_logprobs"], atol=GPU_ATOL, rtol=0)
    for index, (loss, grad_norm) in enumerate(reference["steps"]):
        assert record[f"step{index + 1}"]["loss"].item() == pytest.approx(loss, abs=GPU_ATOL)
        assert record[f"step{index + 1}"]["grad_norm"].item() == pytest.approx(grad_norm, abs=GPU_ATOL)
    assert max_state_diff(record["refit_state"], reference["states"][0]) <= GPU_ATOL
    assert max_state_diff(record["state2"], reference["states"][1]) <= GPU_ATOL


def test_fp32_worker_on_gpu_matches_the_cpu_reference(batch: BatchedDataDict, reference: dict) -> None:
    record = on_gpu(batch)
    assert_matches_reference(record, reference)
    assert record["optimizer_devices_in_logprob_pass"] == {"cuda:0"}


def test_optimizer_state_leaves_the_gpu_for_logprob_passes(batch: BatchedDataDict, reference: dict) -> None:
    """``offload_optimizer_for_logprob``: the state is on CPU during a logprob pass and back for training, with the
    same numbers."""
    record = on_gpu(batch, offload_optimizer_for_logprob=True)
    assert record["optimizer_devices_in_logprob_pass"] == {"cpu"}
    assert_matches_reference(record, reference)


def test_packed_fp32_worker_on_gpu_matches_the_cpu_reference(batch: BatchedDataDict, reference: dict) -> None:
    """Sequence packing (each microbatch one row, attention kept per sample) is exact, on GPU kernels too."""
    packing = SequencePackingConfig(True, train_mb_tokens=64, logprob_mb_tokens=64)
    assert_matches_reference(on_gpu(batch, sequence_packing=packing, max_total_sequence_length=32), reference)


def test_bf16_worker_on_gpu_tracks_fp32(batch: BatchedDataDict, reference: dict) -> None:
    """bf16 compute with fp32 master weights (FSDP2 mixed precision): close to fp32; refit tensors in bf16."""
    record = on_gpu(batch, precision="bfloat16")
    torch.testing.assert_close(record["logprobs"], reference["initial_logprobs"], atol=0.1, rtol=0.02)
    for index, (loss, grad_norm) in enumerate(reference["steps"]):
        assert record[f"step{index + 1}"]["loss"].item() == pytest.approx(loss, rel=1e-2)
        assert record[f"step{index + 1}"]["grad_norm"].item() == pytest.approx(grad_norm, rel=5e-2)
    assert {tensor.dtype for tensor in record["refit_state"].values()} == {torch.bfloat16}
    expected = {name: tensor.bfloat16() for name, tensor in reference["states"][0].items()}
    # ~1 bf16 ulp, and up to 2 * lr where a near-zero gradient changed sign in bf16 (Adam's step is ~lr * sign).
    torch.testing.assert_close(record["refit_state"], expected, atol=2 * 0.1 * LR + 5e-5, rtol=1.6e-2)


def test_bf16_backward_on_gpu_keeps_fp32_logprobs(batch: BatchedDataDict, reference: dict) -> None:
    """``backward_precision: bfloat16`` under an fp32 forward: logprobs and the first loss are fp32's; only the
    gradients (hence the grad norm and the updates) carry bf16 rounding."""
    record = on_gpu(batch, dtensor_backward_precision="bfloat16")
    torch.testing.assert_close(record["logprobs"], reference["initial_logprobs"], atol=GPU_ATOL, rtol=0)
    assert record["step1"]["loss"].item() == pytest.approx(reference["steps"][0][0], abs=GPU_ATOL)
    assert record["step1"]["grad_norm"].item() == pytest.approx(reference["steps"][0][1], rel=2e-2)
    assert {tensor.dtype for tensor in record["refit_state"].values()} == {torch.float32}
