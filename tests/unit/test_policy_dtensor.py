"""`Policy` with DTensor workers on a real local Ray cluster (gloo, CPU bundles), against a plain single-process
Hugging Face + AdamW reference (`tests.unit.policy_reference`).

To keep the file fast on 2 cores, each Ray-backed scenario runs once in a module fixture (one Policy each: 2 FSDP
workers; 1 worker resumed from their checkpoint; dp=2 x tp=2 with sequence parallelism; 2 workers in bf16) and the tests assert on what it
recorded.
Tolerances are for fp32: different sharding/microbatching only reorders float sums (~1e-7).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from nemo_rl_clone.algorithms.loss import ClippedPGLossFn, NLLLossFn
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.distributed.model_utils import valid_counts
from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl_clone.models.hf_export import load_dcp_model_state_dict
from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer, resolve_model_path
from nemo_rl_clone.models.policy.config import (
    DynamicBatchingConfig,
    OptimizerConfig,
    SequencePackingConfig,
)
from nemo_rl_clone.models.policy.interfaces import LogprobOutputSpec, ReferenceLogprobOutputSpec
from nemo_rl_clone.models.policy.lm_policy import Policy
from nemo_rl_clone.utils.config_validation import config_to_dict
from tests.unit.policy_backend_plugin import PLUGIN_PATH
from tests.unit.policy_reference import (
    LR,
    MAX_GRAD_NORM,
    TEXTS,
    make_batch,
    max_state_diff,
    policy_config,
    reference_run,
)


# ---------------------------------------------------------------------------- inputs and the reference
@pytest.fixture(scope="module")
def model_path() -> str:
    return resolve_model_path(TINY_LLAMA)


@pytest.fixture(scope="module")
def tokenizer(model_path: str) -> Any:
    return load_tokenizer(model_path)


@pytest.fixture(scope="module")
def batch(tokenizer: Any) -> BatchedDataDict:
    return make_batch(tokenizer)


@pytest.fixture(scope="module")
def reference(model_path: str, batch: BatchedDataDict) -> dict[str, Any]:
    return reference_run(model_path, batch, steps=3)


# ---------------------------------------------------------------------------- Ray scenarios
@pytest.fixture(scope="module")
def cluster(ray_local: None) -> Iterator[RayVirtualCluster]:
    cluster = RayVirtualCluster([2], use_gpus=False, name="test-policy")
    yield cluster
    cluster.shutdown()


@pytest.fixture(scope="module")
def two_workers(
    cluster: RayVirtualCluster, model_path: str, tokenizer: Any, batch: BatchedDataDict, module_tmp_path: Path
) -> dict[str, Any]:
    """2 FSDP workers: logprobs, 2 steps (reference logprobs and an eval-mode pass in between), checkpoint, 1 more
    step."""
    checkpoint = module_tmp_path / "policy_ckpt"
    policy = Policy(cluster, policy_config(model_path), tokenizer)
    try:
        record: dict[str, Any] = {"checkpoint": checkpoint}
        record["output_keys"] = {"logprobs": set(logprobs := policy.get_logprobs(batch))}
        record["initial_logprobs"] = logprobs["logprobs"]
        # 5 rows over 2 ranks with microbatches of 2: rank 0 runs 2 forwards, rank 1 one real and one dummy.
        record["odd_logprobs"] = policy.get_logprobs(batch.slice(0, 5), micro_batch_size=2)["logprobs"]
        record["step1"] = policy.train(batch, NLLLossFn())
        reference = policy.get_reference_policy_logprobs(batch)
        record["output_keys"]["reference_logprobs"] = set(reference)
        record["reference_logprobs"] = reference["reference_logprobs"]
        record["eval2"] = policy.train(batch, NLLLossFn(), eval_mode=True)
        record["step2"] = policy.train(batch, NLLLossFn())
        policy.save_checkpoint(
            str(checkpoint / "weights"),
            str(checkpoint / "optimizer"),
            tokenizer_path=str(checkpoint / "tokenizer"),
            save_hf_path=str(checkpoint / "hf"),
        )
        record["step3"] = policy.train(batch, NLLLossFn())
        record["state3"] = policy.get_full_state_dict_for_refit()
        record["refit_info"] = policy.prepare_refit_info()
        record["errors"] = _bad_batches(policy, batch)
    finally:
        policy.shutdown()  # frees the bundles for the next scenario on this cluster
    return record


def _bad_batches(policy: Policy, batch: BatchedDataDict) -> dict[str, Exception]:
    """Each bad call's exception (the policy must stay usable after each)."""
    calls = {
        "smaller_than_dp": lambda: policy.get_logprobs(batch.slice(0, 1)),
        "not_a_multiple_of_gbs": lambda: policy.train(batch.slice(0, 6), NLLLossFn()),
        "gbs_not_divisible_by_dp": lambda: policy.train(batch.slice(0, 3), NLLLossFn(), gbs=3),
        "missing_key": lambda: policy.get_logprobs(BatchedDataDict(input_ids=batch["input_ids"])),
    }
    errors = {}
    for name, call in calls.items():
        try:
            call()
        except Exception as error:  # recorded and asserted on by the tests below
            errors[name] = error
    return errors


@pytest.fixture(scope="module")
def resumed_one_worker(
    two_workers: dict[str, Any], model_path: str, tokenizer: Any, batch: BatchedDataDict
) -> dict[str, Any]:
    """1 worker loading the 2-worker checkpoint (a different DP size), then the same third step."""
    cluster = RayVirtualCluster([1], use_gpus=False, name="test-policy-resume")
    checkpoint = two_workers["checkpoint"]
    policy = Policy(
        cluster,
        policy_config(model_path),
        tokenizer,
        name_prefix="policy-resumed",
        weights_path=str(checkpoint / "weights"),
        optimizer_path=str(checkpoint / "optimizer"),
    )
    try:
        record = {"loaded_state": policy.get_full_state_dict_for_refit()}
        record["reference_logprobs"] = policy.get_reference_policy_logprobs(batch)["reference_logprobs"]
        record["step3"] = policy.train(batch, NLLLossFn())
        record["state3"] = policy.get_full_state_dict_for_refit()
    finally:
        policy.shutdown()
        cluster.shutdown()
    return record


TP_DYNAMIC_BATCHING = DynamicBatchingConfig(True, train_mb_tokens=32, logprob_mb_tokens=40, sequence_length_round=4)


@pytest.fixture(scope="module")
def tensor_parallel(
    two_workers: dict[str, Any], model_path: str, tokenizer: Any, batch: BatchedDataDict
) -> dict[str, Any]:
    """4 workers as dp=2 x tp=2 (FSDP over TP-sharded layers) with sequence parallelism (the residual stream split
    over the tp ranks; plain TP against the unsplit model: tests/unit/test_dtensor_sequence_parallel.py), activation
    checkpointing, dynamic batching
    (length-sorted microbatches of at most 32/40 padded tokens, truncated to their longest row) and logprobs in
    chunks of 3 positions (``policy.logprob_chunk_size``, in get_logprobs and the loss): logprobs, one step,
    reference logprobs, refit info. Compared with the unchunked data-parallel run and plain HF below."""
    config = policy_config(
        model_path,
        dtensor_tensor_parallel_size=2,
        dtensor_sequence_parallel=True,
        dtensor_activation_checkpointing=True,
        dynamic_batching=TP_DYNAMIC_BATCHING,
        logprob_chunk_size=3,
    )
    cluster = RayVirtualCluster([4], use_gpus=False, name="test-policy-tp")
    policy = Policy(cluster, config, tokenizer, name_prefix="policy-tp")
    try:
        record = {"initial_logprobs": policy.get_logprobs(batch)["logprobs"]}
        record["step1"] = policy.train(batch, NLLLossFn())
        record["state1"] = policy.get_full_state_dict_for_refit()
        record["reference_logprobs"] = policy.get_reference_policy_logprobs(batch)["reference_logprobs"]
        record["refit_info"] = policy.prepare_refit_info()
    finally:
        policy.shutdown()
        cluster.shutdown()
    return record


PACKING = SequencePackingConfig(True, train_mb_tokens=24, logprob_mb_tokens=20)


@pytest.fixture(scope="module")
def packed_two_workers(
    two_workers: dict[str, Any], cluster: RayVirtualCluster, model_path: str, tokenizer: Any, batch: BatchedDataDict
) -> dict[str, Any]:
    """Sequence packing on 2 workers (bins of at most 24 / 20 tokens, each run as one row): logprobs, one step,
    reference logprobs."""
    config = policy_config(model_path, max_total_sequence_length=batch["input_ids"].shape[1], sequence_packing=PACKING)
    policy = Policy(cluster, config, tokenizer, name_prefix="policy-packed")
    try:
        record = {"initial_logprobs": policy.get_logprobs(batch)["logprobs"], "step1": policy.train(batch, NLLLossFn())}
        record["state1"] = policy.get_full_state_dict_for_refit()
        record["reference_logprobs"] = policy.get_reference_policy_logprobs(batch)["reference_logprobs"]
        record["pg_batch"] = pg_batch(batch, record["initial_logprobs"])
        record["pg_step"] = policy.train(record["pg_batch"], PG_LOSS)
    finally:
        policy.shutdown()
    return record


# GRPO-like advantages: rows 3, 4 and 6 carry a gradient (row 5, the masked one, does not; the rest have A = 0).
PG_ADVANTAGES = [0.0, 0.0, 0.0, 1.0, -1.0, 0.3, 0.5, 0.0]
PG_LOSS = ClippedPGLossFn({"reference_policy_kl_penalty": 0.0, "force_on_policy_ratio": True})


def pg_batch(batch: BatchedDataDict, generation_logprobs: torch.Tensor) -> BatchedDataDict:
    advantages = torch.tensor(PG_ADVANTAGES)[:, None].expand_as(batch["token_mask"]).contiguous()
    return BatchedDataDict({**batch, "advantages": advantages, "generation_logprobs": generation_logprobs})


@pytest.fixture(scope="module")
def context_parallel_two_workers(
    two_workers: dict[str, Any], cluster: RayVirtualCluster, model_path: str, tokenizer: Any, batch: BatchedDataDict
) -> dict[str, Any]:
    """Sequences split over 2 context-parallel ranks (ring attention, head-and-tail balanced): one replica through
    the selective head, one with the full logits, and 2 replicas (dp=2 x cp=2 on 4 workers): logprobs, one step,
    reference logprobs."""
    record: dict[str, Any] = {}
    four_workers = RayVirtualCluster([4], use_gpus=False, name="test-policy-cp")
    try:
        for layout, on, selective in (
            ("selective", cluster, True),
            ("full_logits", cluster, False),
            ("dp2", four_workers, True),
            ("tp2_sp", four_workers, True),
        ):
            tensor_parallel = {"dtensor_tensor_parallel_size": 2, "dtensor_sequence_parallel": True}
            config = policy_config(
                model_path,
                dtensor_context_parallel_size=2,
                dtensor_logits_at_loss_tokens_only=selective,
                **(tensor_parallel if layout == "tp2_sp" else {}),
            )
            policy = Policy(on, config, tokenizer, name_prefix=f"policy-cp-{layout}")
            try:
                record[layout] = {"initial_logprobs": policy.get_logprobs(batch)["logprobs"]}
                record[layout]["step1"] = policy.train(batch, NLLLossFn())
                record[layout]["state1"] = policy.get_full_state_dict_for_refit()
                reference_logprobs = policy.get_reference_policy_logprobs(batch)["reference_logprobs"]
                record[layout]["reference_logprobs"] = reference_logprobs
            finally:
                policy.shutdown()
    finally:
        four_workers.shutdown()
    return record


@pytest.fixture(scope="module")
def bf16_two_workers(
    two_workers: dict[str, Any], cluster: RayVirtualCluster, model_path: str, tokenizer: Any, batch: BatchedDataDict
) -> dict[str, Any]:
    """bf16 compute (FSDP mixed precision, fp32 master weights and gradient reduction) on 2 workers: one step. The
    workers come from a policy backend registered outside the package (`tests.unit.policy_backend_plugin`: the
    DTensor worker under another class), chosen by ``policy.backend``."""
    config = policy_config(model_path, precision="bfloat16", backend=PLUGIN_PATH)
    policy = Policy(cluster, config, tokenizer, name_prefix="policy-bf16")
    try:
        record = {"logprobs": policy.get_logprobs(batch)["logprobs"], "step1": policy.train(batch, NLLLossFn())}
        record["refit_state"] = policy.get_full_state_dict_for_refit()
        record["backend"] = ray.get(policy.worker_group.run_all_workers_single_data("backend_name"))
    finally:
        policy.shutdown()
    return record


# ---------------------------------------------------------------------------- logprobs
def test_logprobs_equal_a_plain_hf_forward(two_workers: dict, reference: dict, batch: BatchedDataDict) -> None:
    logprobs = two_workers["initial_logprobs"]
    assert logprobs.shape == batch["input_ids"].shape and logprobs.dtype == torch.float32
    torch.testing.assert_close(logprobs, reference["initial_logprobs"], atol=1e-5, rtol=0)


def test_returns_have_exactly_nemo_rl_output_spec_keys(two_workers: dict) -> None:
    assert two_workers["output_keys"] == {
        "logprobs": LogprobOutputSpec.__required_keys__,
        "reference_logprobs": ReferenceLogprobOutputSpec.__required_keys__,
    }


def test_logprob_layout_zero_at_position_zero_and_padding(two_workers: dict, batch: BatchedDataDict) -> None:
    logprobs = two_workers["initial_logprobs"]
    positions = torch.arange(logprobs.shape[1])
    padding = positions[None, :] >= batch["input_lengths"][:, None]
    assert padding.any(), "the batch must contain padding for this test to mean anything"
    assert (logprobs[:, 0] == 0).all() and (logprobs[padding] == 0).all()
    assert (logprobs[:, 1:][~padding[:, 1:]] < 0).all()


def test_uneven_shards_and_microbatch_counts(two_workers: dict, reference: dict) -> None:
    torch.testing.assert_close(two_workers["odd_logprobs"], reference["initial_logprobs"][:5], atol=1e-5, rtol=0)


def test_tensor_parallel_logprobs_equal_data_parallel(
    tensor_parallel: dict, two_workers: dict, reference: dict
) -> None:
    torch.testing.assert_close(tensor_parallel["initial_logprobs"], two_workers["initial_logprobs"], atol=1e-5, rtol=0)
    torch.testing.assert_close(tensor_parallel["initial_logprobs"], reference["initial_logprobs"], atol=1e-5, rtol=0)


def test_reference_logprobs_are_the_initial_weights(two_workers: dict, tensor_parallel: dict, reference: dict) -> None:
    """Taken after training steps, so the reference must come from the frozen copy, not the live weights."""
    torch.testing.assert_close(two_workers["reference_logprobs"], reference["initial_logprobs"], atol=1e-5, rtol=0)
    torch.testing.assert_close(tensor_parallel["reference_logprobs"], reference["initial_logprobs"], atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------- training
def test_two_workers_train_like_the_single_process_reference(two_workers: dict, reference: dict) -> None:
    """Global-count normalisation: loss, grad norm (before clipping) and weights match the unsharded reference,
    also for step 2, which ran after a reference-logprob pass (weights swapped out and back) and an eval pass."""
    for step in (1, 2, 3):
        result = two_workers[f"step{step}"]
        expected_loss, expected_norm = reference["steps"][step - 1]
        assert result["loss"].shape == (1,) and result["grad_norm"].shape == (1,)
        assert result["loss"].item() == pytest.approx(expected_loss, abs=1e-5)
        assert result["grad_norm"].item() == pytest.approx(expected_norm, abs=1e-5)
    assert expected_norm > MAX_GRAD_NORM, "the gradients must be large enough for clipping to matter"
    assert max_state_diff(two_workers["state3"], reference["states"][2]) <= 1e-5


def test_eval_mode_computes_the_loss_without_updating(two_workers: dict) -> None:
    """The eval pass before step 2 sees step 2's weights; step 2 still matching the reference (test above) shows
    that it changed neither the weights nor the LR schedule."""
    assert two_workers["eval2"]["loss"].item() == pytest.approx(two_workers["step2"]["loss"].item(), abs=1e-6)
    assert two_workers["eval2"]["grad_norm"].tolist() == [0.0]


def test_microbatch_metrics_sum_to_the_global_loss(two_workers: dict, batch: BatchedDataDict) -> None:
    metrics = two_workers["step1"]["all_mb_metrics"]
    # 8 rows / 2 ranks / microbatches of 2 = 2 microbatches per rank, 4 in all.
    assert {len(values) for values in metrics.values()} == {4}
    assert sum(metrics["loss"]) == pytest.approx(two_workers["step1"]["loss"].item(), abs=1e-6)
    expected_tokens = (batch["token_mask"][:, 1:] * batch["sample_mask"][:, None]).sum().item()
    assert sum(metrics["num_unmasked_tokens"]) == expected_tokens
    assert set(metrics["global_valid_toks"]) == {expected_tokens}
    assert set(metrics["global_valid_seqs"]) == {len(TEXTS) - 1}
    assert metrics["lr"] == [pytest.approx(0.1 * LR)] * 4  # LinearLR's first step


def test_one_worker_resumed_from_two_worker_checkpoint_continues_identically(
    resumed_one_worker: dict, two_workers: dict, reference: dict
) -> None:
    """Resume with another DP size: weights, optimizer and scheduler state all carry over."""
    assert max_state_diff(resumed_one_worker["loaded_state"], reference["states"][1]) <= 1e-5
    step3 = resumed_one_worker["step3"]
    assert step3["all_mb_metrics"]["lr"][0] == pytest.approx(two_workers["step3"]["all_mb_metrics"]["lr"][0])
    assert abs(step3["loss"].item() - two_workers["step3"]["loss"].item()) <= 1e-6
    # The norm is summed over differently sized shards here (2 vs 1), so it carries fp32 reordering error (~2e-6).
    assert abs(step3["grad_norm"].item() - two_workers["step3"]["grad_norm"].item()) <= 1e-5
    assert max_state_diff(resumed_one_worker["state3"], two_workers["state3"]) <= 1e-6


def test_resume_keeps_the_original_reference_model(resumed_one_worker: dict, reference: dict) -> None:
    torch.testing.assert_close(
        resumed_one_worker["reference_logprobs"], reference["initial_logprobs"], atol=1e-5, rtol=0
    )


def test_tensor_parallel_training_step(tensor_parallel: dict, reference: dict, batch: BatchedDataDict) -> None:
    expected_loss, expected_norm = reference["steps"][0]
    shards, _ = batch.shard_by_batch_size(
        2,
        batch_size=8,
        dynamic_batching_args={
            "input_key": "input_ids",
            "input_lengths_key": "input_lengths",
            "max_tokens_per_microbatch": TP_DYNAMIC_BATCHING.train_mb_tokens,
            "sequence_length_round": TP_DYNAMIC_BATCHING.sequence_length_round,
        },
    )
    planned = sum(len(shard.micro_batch_indices[0]) for shard in shards)
    assert planned != 8 // 2, "the token budget must change the microbatching for this test to mean anything"
    assert len(tensor_parallel["step1"]["all_mb_metrics"]["loss"]) == planned  # one TP rank reports per DP rank
    assert tensor_parallel["step1"]["loss"].item() == pytest.approx(expected_loss, abs=1e-5)
    assert tensor_parallel["step1"]["grad_norm"].item() == pytest.approx(expected_norm, abs=1e-5)
    assert max_state_diff(tensor_parallel["state1"], reference["states"][0]) <= 1e-5


def test_sequence_packing_equals_padded_rows(packed_two_workers: dict, reference: dict, batch: BatchedDataDict) -> None:
    """Packed bins (several samples in one row, attention kept per sample) give the reference's logprobs, loss,
    grad norm and weights, with no padding computed."""
    shards, _ = batch.shard_by_batch_size(
        2,
        batch_size=8,
        sequence_packing_args={
            "input_key": "input_ids",
            "input_lengths_key": "input_lengths",
            "max_tokens_per_microbatch": PACKING.train_mb_tokens,
            "algorithm": PACKING.algorithm,
        },
    )
    bins = [end - start for shard in shards for start, end in shard.micro_batch_indices[0]]
    assert max(bins) > 1, "some bin must pack several samples for this test to mean anything"
    step1 = packed_two_workers["step1"]
    assert len(step1["all_mb_metrics"]["loss"]) == len(bins)
    torch.testing.assert_close(packed_two_workers["initial_logprobs"], reference["initial_logprobs"], atol=1e-5, rtol=0)
    torch.testing.assert_close(
        packed_two_workers["reference_logprobs"], reference["initial_logprobs"], atol=1e-5, rtol=0
    )
    expected_loss, expected_norm = reference["steps"][0]
    assert step1["loss"].item() == pytest.approx(expected_loss, abs=1e-5)
    assert step1["grad_norm"].item() == pytest.approx(expected_norm, abs=1e-5)
    assert max_state_diff(packed_two_workers["state1"], reference["states"][0]) <= 1e-5
    profile = step1["profile"]
    assert profile.computed_tokens == profile.valid_tokens == int(batch["input_lengths"].sum())


def test_rows_without_gradient_left_out_of_a_packed_step_change_nothing(
    packed_two_workers: dict, model_path: str
) -> None:
    """`Policy.train` with a GRPO loss runs rows 3, 4, 6 and one top-up row (2 ranks, packed bins), yet its
    loss and grad norm (before clipping) are those of the whole batch, computed here by plain HF over every row."""
    data, result = packed_two_workers["pg_batch"], packed_two_workers["pg_step"]
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.load_state_dict(packed_two_workers["state1"])
    seqs, toks = valid_counts(data)
    loss, _ = PG_LOSS(model(input_ids=data["input_ids"]).logits.float(), data, seqs, toks)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
    assert result["num_trained_samples"] == 3 and result["num_global_batches_with_metrics"] == 1
    assert result["loss"].item() == pytest.approx(loss.item(), abs=1e-5)
    assert result["grad_norm"].item() == pytest.approx(grad_norm.item(), rel=1e-5)
    assert abs(loss.item()) > 1e-3 and grad_norm.item() > 1e-2
    metrics = result["all_mb_metrics"]
    # the loss's metrics cover the 4 rows that ran (the top-up is unmasked); the normalisation is the whole batch's
    assert set(metrics["global_valid_toks"]) == {toks.item()} and sum(metrics["num_valid_samples"]) == 4


@pytest.mark.parametrize("layout", ["selective", "full_logits", "dp2", "tp2_sp"])
def test_context_parallel_equals_the_unsplit_model(
    context_parallel_two_workers: dict, reference: dict, batch: BatchedDataDict, layout: str
) -> None:
    """Each sequence split over 2 ranks (padded to a multiple of 4, ring attention): the reference's logprobs, loss
    and weights to 1e-5, grad norm to 1e-5 relative."""
    record = context_parallel_two_workers[layout]
    assert batch["input_ids"].shape[1] % 4, "the width must need padding to 2 x cp for this test to cover it"
    torch.testing.assert_close(record["initial_logprobs"], reference["initial_logprobs"], atol=1e-5, rtol=0)
    torch.testing.assert_close(record["reference_logprobs"], reference["initial_logprobs"], atol=1e-5, rtol=0)
    expected_loss, expected_norm = reference["steps"][0]
    assert record["step1"]["loss"].item() == pytest.approx(expected_loss, abs=1e-5)
    # Gradients go through two reductions here (the gather's backward over cp, FSDP's over dp x cp): the norm
    # carries more fp32 reordering than elsewhere (3e-6 relative measured with dp=2 x cp=2).
    assert record["step1"]["grad_norm"].item() == pytest.approx(expected_norm, rel=1e-5)
    assert max_state_diff(record["state1"], reference["states"][0]) <= 1e-5
    # 8 rows in microbatches of 2 (over 1 or 2 replicas): 4 microbatches, each reported once (not per cp rank).
    assert len(record["step1"]["all_mb_metrics"]["loss"]) == 4


def test_bf16_mixed_precision_tracks_fp32(bf16_two_workers: dict, reference: dict) -> None:
    """bf16 compute with fp32 master weights and gradient reduction (measured: logprobs 4e-3, loss 4e-5 relative,
    grad norm 2e-3 relative); refit tensors are the updated weights in bf16. It trained through the plug-in backend."""
    assert bf16_two_workers["backend"] == ["plugin", "plugin"]
    torch.testing.assert_close(bf16_two_workers["logprobs"], reference["initial_logprobs"], atol=2e-2, rtol=0)
    assert bf16_two_workers["step1"]["loss"].item() == pytest.approx(reference["steps"][0][0], rel=1e-3)
    assert bf16_two_workers["step1"]["grad_norm"].item() == pytest.approx(reference["steps"][0][1], rel=1e-2)
    # ~1 bf16 ulp, and up to 2 * lr where a near-zero gradient changed sign in bf16 (Adam's step is ~lr * sign).
    expected = {name: tensor.bfloat16() for name, tensor in reference["states"][0].items()}
    torch.testing.assert_close(bf16_two_workers["refit_state"], expected, atol=2 * 0.1 * LR + 5e-5, rtol=1.6e-2)


# ---------------------------------------------------------------------------- checkpoint artefacts and refit info
def test_checkpoint_exports_a_loadable_hf_folder_and_tokenizer(
    two_workers: dict, resumed_one_worker: dict, tokenizer: Any
) -> None:
    checkpoint: Path = two_workers["checkpoint"]
    exported = AutoModelForCausalLM.from_pretrained(checkpoint / "hf", dtype=torch.float32)
    assert max_state_diff(exported.state_dict(), resumed_one_worker["loaded_state"]) == 0.0
    # The converter's reader (examples/converters/convert_dcp_to_hf.py) sees the same weights in the sharded DCP.
    assert max_state_diff(load_dcp_model_state_dict(checkpoint / "weights"), resumed_one_worker["loaded_state"]) == 0.0
    saved_tokenizer = AutoTokenizer.from_pretrained(checkpoint / "tokenizer")
    assert saved_tokenizer(TEXTS[0])["input_ids"] == tokenizer(TEXTS[0])["input_ids"]


def test_refit_info_lists_full_shapes_under_any_sharding(
    two_workers: dict, tensor_parallel: dict, reference: dict
) -> None:
    expected = {name: (tensor.shape, torch.float32) for name, tensor in reference["states"][0].items()}
    assert two_workers["refit_info"] == expected
    assert tensor_parallel["refit_info"] == expected
    assert {name: (t.shape, t.dtype) for name, t in two_workers["state3"].items()} == expected


# ---------------------------------------------------------------------------- bad input
def test_bad_batches_raise_one_clear_error(two_workers: dict) -> None:
    errors = two_workers["errors"]
    assert isinstance(errors["smaller_than_dp"], ValueError)
    assert "batch of 1 samples is smaller than the data-parallel size 2" in str(errors["smaller_than_dp"])
    assert "batch of 6 samples is not a multiple of the global batch size 8" in str(errors["not_a_multiple_of_gbs"])
    assert "global batch size 3" in str(errors["gbs_not_divisible_by_dp"])
    assert "divisible by the data-parallel size 2" in str(errors["gbs_not_divisible_by_dp"])
    assert isinstance(errors["missing_key"], KeyError) and "'input_lengths'" in str(errors["missing_key"])


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        (
            {"optimizer": OptimizerConfig("torch.optim.AdamWW", {"lr": 1e-3})},
            ValueError,
            "policy.optimizer.name: cannot import 'torch.optim.AdamWW' (did you mean torch.optim.AdamW?)",
        ),
        ({"model_name": "./no/such/model-dir"}, FileNotFoundError, "model folder './no/such/model-dir' does not exist"),
        (
            {"dtensor_tensor_parallel_size": 3},
            ValueError,
            "tensor_parallel_size=3 must divide the number of workers (2)",
        ),
        (
            {"sequence_packing": SequencePackingConfig(True, train_mb_tokens=64, logprob_mb_tokens=512)},
            ValueError,
            "policy.sequence_packing.train_mb_tokens: 64 is below 512, the cost of a max_total_sequence_length sample "
            "(rounded up to sequence_length_round=1): it would fit no microbatch",
        ),
        ({"train_global_batch_size": 7}, ValueError, "policy.train_global_batch_size: must be a multiple of"),
    ],
)
def test_bad_config_fails_before_any_worker_starts(
    cluster: RayVirtualCluster, model_path: str, tokenizer: Any, overrides: dict, error: type, message: str
) -> None:
    # As NeMo-RL's mapping: the facade validates it (a PolicyConfig was validated where the config was loaded).
    config = config_to_dict(policy_config(model_path, **overrides))
    with pytest.raises(error) as raised:
        Policy(cluster, config, tokenizer, name_prefix="policy-bad")
    assert message in str(raised.value)


# ---------------------------------------------------------------------------- GPU (skipped without CUDA)
requires_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
)


def _gpu_scenario(model_path: str, tokenizer: Any, batch: BatchedDataDict, workers: int, **overrides: Any) -> dict:
    """One step, an offload/refit/reload cycle as GRPO does it, reference logprobs, a second step."""
    cluster = RayVirtualCluster(
        [workers], use_gpus=True, num_gpus_per_node=torch.cuda.device_count(), name="test-policy-gpu"
    )
    policy = Policy(cluster, policy_config(model_path, **overrides), tokenizer, name_prefix=f"policy-gpu{workers}")
    try:
        record = {"logprobs": policy.get_logprobs(batch)["logprobs"], "step1": policy.train(batch, NLLLossFn())}
        policy.offload_before_refit()
        record["refit_state"] = policy.get_full_state_dict_for_refit()
        policy.offload_after_refit()
        policy.prepare_for_lp_inference()
        record["reference_logprobs"] = policy.get_reference_policy_logprobs(batch)["reference_logprobs"]
        policy.prepare_for_training()
        record["step2"] = policy.train(batch, NLLLossFn())
        record["state2"] = policy.get_full_state_dict_for_refit()
    finally:
        policy.shutdown()
        cluster.shutdown()
    return record


# GPU kernels (cuBLAS, memory-efficient SDPA) differ from the CPU reference's, so fp32 agreement is ~1e-6..1e-5.
GPU_ATOL = 1e-4


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("workers", [1, 2])
def test_gpu_fp32_policy_matches_the_reference(
    ray_local: None, model_path: str, tokenizer: Any, batch: BatchedDataDict, reference: dict, workers: int
) -> None:
    if torch.cuda.device_count() < workers:
        pytest.skip(f"needs {workers} GPUs, found {torch.cuda.device_count()}")
    record = _gpu_scenario(model_path, tokenizer, batch, workers)
    torch.testing.assert_close(record["logprobs"], reference["initial_logprobs"], atol=GPU_ATOL, rtol=0)
    torch.testing.assert_close(record["reference_logprobs"], reference["initial_logprobs"], atol=GPU_ATOL, rtol=0)
    for step in (1, 2):
        expected_loss, expected_norm = reference["steps"][step - 1]
        assert record[f"step{step}"]["loss"].item() == pytest.approx(expected_loss, abs=GPU_ATOL)
        assert record[f"step{step}"]["grad_norm"].item() == pytest.approx(expected_norm, abs=GPU_ATOL)
    assert max_state_diff(record["refit_state"], reference["states"][0]) <= GPU_ATOL
    assert max_state_diff(record["state2"], reference["states"][1]) <= GPU_ATOL


@pytest.mark.gpu
@requires_cuda
def test_gpu_bf16_mixed_precision_tracks_fp32(
    ray_local: None, model_path: str, tokenizer: Any, batch: BatchedDataDict, reference: dict
) -> None:
    """bf16 compute with fp32 master weights and gradient reduction: close to fp32, refit tensors in bf16."""
    record = _gpu_scenario(model_path, tokenizer, batch, 1, precision="bfloat16")
    assert {tensor.dtype for tensor in record["refit_state"].values()} == {torch.bfloat16}
    for step in (1, 2):
        assert record[f"step{step}"]["loss"].item() == pytest.approx(reference["steps"][step - 1][0], rel=1e-2)
    torch.testing.assert_close(record["logprobs"], reference["initial_logprobs"], atol=0.1, rtol=0.02)
