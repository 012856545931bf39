"""Reward-model mode of the DTensor `Policy` (``policy.reward_model_cfg.enabled``) on a real local Ray cluster.

tiny-random-llama has pad == eos (id 2). Every row here is ``prompt <eos> answer <eos>`` right-padded with 2, so the
pad id appears inside each sequence and ends it: Hugging Face's own pooling (rightmost token != pad id) would score
the token before the final eos. References are plain single-process Hugging Face forwards written out below.

To stay fast on 2 cores, two Ray scenarios run once each (module fixtures) and the tests assert on what they
recorded: 2 FSDP workers score, train Bradley-Terry for 15 steps, save (DCP + HF export), take a 16th step; then
1 worker resumes from that checkpoint, scores and takes the same 16th step; 1 worker with dynamic batching scores.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from nemo_rl_clone.algorithms.loss import PreferenceLossFn
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer, resolve_model_path
from nemo_rl_clone.models.policy.config import (
    DynamicBatchingConfig,
    OptimizerConfig,
    PolicyConfig,
    RewardModelConfig,
)
from nemo_rl_clone.models.policy.interfaces import ScoreOutputSpec
from nemo_rl_clone.models.policy.lm_policy import Policy
from nemo_rl_clone.models.policy.workers.reward_model import SCORE_HEAD_INIT_SEED
from nemo_rl_clone.utils.config_validation import ConfigError, config_to_dict, validate_config

TRAIN_STEPS = 15
TRAIN_QUESTIONS = range(8)  # 8 pairs = 16 rows = one global batch
HELD_OUT_QUESTIONS = range(100, 108)
CHOSEN_ANSWERS = (" Answer: yes, it is.", " Answer: yes.")  # the learnable pattern: "yes" is preferred over "no"
REJECTED_ANSWERS = (" Answer: no.", " Answer: no, it is not.")  # lengths vary both ways: length is no shortcut


# ---------------------------------------------------------------------------- data and references
@pytest.fixture(scope="module")
def model_path() -> str:
    return resolve_model_path(TINY_LLAMA)


@pytest.fixture(scope="module")
def tokenizer(model_path: str) -> Any:
    return load_tokenizer(model_path)


def preference_batch(tokenizer: Any, questions: range) -> BatchedDataDict:
    """Rows ``2i`` (chosen) / ``2i + 1`` (rejected) of pair ``i``, right-padded with the pad id (== eos)."""
    eos = tokenizer.eos_token_id
    assert tokenizer.pad_token_id == eos, "these tests are about pad == eos"

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    rows = []
    for q in questions:
        prompt = [*encode(f"Question {q}: is {q} a nice number?"), eos]
        rows.append(prompt + encode(CHOSEN_ANSWERS[q % 2]) + [eos])
        rows.append(prompt + encode(REJECTED_ANSWERS[q % 2]) + [eos])
    width = max(map(len, rows))
    return BatchedDataDict(
        input_ids=torch.tensor([row + [eos] * (width - len(row)) for row in rows]),
        input_lengths=torch.tensor([len(row) for row in rows]),
        sample_mask=torch.ones(len(rows)),
    )


@pytest.fixture(scope="module")
def train_batch(tokenizer: Any) -> BatchedDataDict:
    return preference_batch(tokenizer, TRAIN_QUESTIONS)


@pytest.fixture(scope="module")
def held_out_batch(tokenizer: Any) -> BatchedDataDict:
    return preference_batch(tokenizer, HELD_OUT_QUESTIONS)


def hf_last_token_scores(model: torch.nn.Module, data: BatchedDataDict) -> torch.Tensor:
    """``[B]`` scores of a plain HF seq-cls model: its head on the final hidden state at ``input_lengths - 1``."""
    with torch.no_grad():
        hidden = model.model(input_ids=data["input_ids"]).last_hidden_state
        token_scores = model.score(hidden)[..., 0]
    return torch.stack([token_scores[row, length - 1] for row, length in enumerate(data["input_lengths"].tolist())])


def pair_accuracy(scores: torch.Tensor) -> float:
    return (scores[0::2] > scores[1::2]).float().mean().item()


def rm_config(model_path: str, **overrides: Any) -> PolicyConfig:
    config = PolicyConfig(
        model_name=model_path,
        train_global_batch_size=16,
        train_micro_batch_size=4,
        logprob_batch_size=3,
        precision="float32",
        max_grad_norm=1.0,
        optimizer=OptimizerConfig("torch.optim.AdamW", {"lr": 1e-3, "weight_decay": 0.0}),
        scheduler=None,
        reward_model_cfg=RewardModelConfig(enabled=True),
    )
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


# ---------------------------------------------------------------------------- Ray scenarios
@pytest.fixture(scope="module")
def two_workers(
    ray_local: None,
    model_path: str,
    tokenizer: Any,
    train_batch: BatchedDataDict,
    held_out_batch: BatchedDataDict,
    module_tmp_path: Path,
) -> Iterator[dict[str, Any]]:
    checkpoint = module_tmp_path / "rm_ckpt"
    cluster = RayVirtualCluster([2], use_gpus=False, name="test-rm-policy")
    policy = Policy(cluster, rm_config(model_path), tokenizer, name_prefix="rm-policy")
    try:
        record: dict[str, Any] = {"checkpoint": checkpoint}
        record["score_keys"] = set(scores := policy.score(held_out_batch))
        record["initial_held_out"] = scores["scores"]
        # 5 rows over 2 ranks in microbatches of 2: uneven shards and microbatch counts.
        record["odd_scores"] = policy.score(held_out_batch.slice(0, 5), micro_batch_size=2)["scores"]
        record["steps"] = [policy.train(train_batch, PreferenceLossFn()) for _ in range(TRAIN_STEPS)]
        record["final_held_out"] = policy.score(held_out_batch)["scores"]
        policy.save_checkpoint(
            str(checkpoint / "weights"),
            str(checkpoint / "optimizer"),
            tokenizer_path=str(checkpoint / "tokenizer"),
            save_hf_path=str(checkpoint / "hf"),
            save_hf_format="torch_save",  # the LM policy test covers safetensors
        )
        record["next_step"] = policy.train(train_batch, PreferenceLossFn())
        record["errors"] = _errors(policy, held_out_batch)
    finally:
        policy.shutdown()
        cluster.shutdown()
    yield record


def _errors(policy: Policy, batch: BatchedDataDict) -> dict[str, Exception]:
    too_long = BatchedDataDict({**batch, "input_lengths": batch["input_lengths"].clone()})
    too_long["input_lengths"][3] = batch["input_ids"].shape[1] + 1
    calls = {
        "get_logprobs": lambda: policy.get_logprobs(batch),
        "get_reference_policy_logprobs": lambda: policy.get_reference_policy_logprobs(batch),
        "get_full_state_dict_for_refit": policy.get_full_state_dict_for_refit,
        "train_without_lengths": lambda: policy.train(
            BatchedDataDict(input_ids=batch["input_ids"], sample_mask=batch["sample_mask"]), PreferenceLossFn()
        ),
        "lengths_out_of_range": lambda: policy.score(too_long),
        "odd_micro_batch": lambda: policy.train(batch, PreferenceLossFn(), mbs=1),
    }
    errors = {}
    for name, call in calls.items():
        try:
            call()
        except Exception as error:  # asserted on below
            errors[name] = error
    return errors


@pytest.fixture(scope="module")
def one_worker(
    two_workers: dict[str, Any],
    model_path: str,
    tokenizer: Any,
    train_batch: BatchedDataDict,
    held_out_batch: BatchedDataDict,
) -> Iterator[dict[str, Any]]:
    """1 worker resumed from the 2-worker checkpoint (weights + optimizer): scores and the 16th step. Then 1 worker
    with dynamic batching (token-budgeted, length-sorted microbatches) loading the weights: scores."""
    checkpoint = two_workers["checkpoint"]
    cluster = RayVirtualCluster([1], use_gpus=False, name="test-rm-policy-resume")
    record: dict[str, Any] = {}
    try:
        policy = Policy(
            cluster,
            rm_config(model_path),
            tokenizer,
            name_prefix="rm-policy-resumed",
            weights_path=str(checkpoint / "weights"),
            optimizer_path=str(checkpoint / "optimizer"),
        )
        try:
            record["held_out"] = policy.score(held_out_batch)["scores"]
            record["next_step"] = policy.train(train_batch, PreferenceLossFn())
        finally:
            policy.shutdown()
        dynamic = DynamicBatchingConfig(True, train_mb_tokens=64, logprob_mb_tokens=48, sequence_length_round=4)
        policy = Policy(
            cluster,
            rm_config(model_path, dynamic_batching=dynamic),
            tokenizer,
            name_prefix="rm-policy-dynamic",
            init_optimizer=False,
            weights_path=str(checkpoint / "weights"),
        )
        try:
            record["dynamic_held_out"] = policy.score(held_out_batch)["scores"]
            try:
                policy.train(train_batch, PreferenceLossFn())
            except ValueError as error:
                record["dynamic_train_error"] = error
        finally:
            policy.shutdown()
    finally:
        cluster.shutdown()
    yield record


# ---------------------------------------------------------------------------- scores
def test_scores_equal_a_plain_hf_forward_at_the_last_valid_token(
    two_workers: dict, model_path: str, held_out_batch: BatchedDataDict
) -> None:
    """From a causal-LM checkpoint the score head is fresh, drawn under SCORE_HEAD_INIT_SEED on every rank."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SCORE_HEAD_INIT_SEED)
        reference = AutoModelForSequenceClassification.from_pretrained(model_path, num_labels=1, dtype=torch.float32)
    expected = hf_last_token_scores(reference, held_out_batch)
    scores = two_workers["initial_held_out"]
    assert scores.shape == (16,) and scores.dtype == torch.float32
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(two_workers["odd_scores"], expected[:5], atol=1e-5, rtol=0)
    # Hugging Face's pooling scores the last token that is not the pad id, i.e. the one before the final eos.
    with torch.no_grad():
        hf_pooled = reference(input_ids=held_out_batch["input_ids"]).logits[:, 0]
    before_eos = held_out_batch.slice(0, 16)
    before_eos["input_lengths"] = held_out_batch["input_lengths"] - 1
    torch.testing.assert_close(hf_pooled, hf_last_token_scores(reference, before_eos), atol=1e-5, rtol=0)
    assert (hf_pooled - expected).abs().min() > 1e-4, "the eos position must give other scores for this to test"


# ---------------------------------------------------------------------------- training
def test_score_returns_exactly_nemo_rl_score_output_spec(two_workers: dict) -> None:
    assert two_workers["score_keys"] == ScoreOutputSpec.__required_keys__


def test_bradley_terry_training_learns_the_preference(two_workers: dict) -> None:
    """Loss falls and held-out pairs (other questions, same rule) become correctly ranked."""
    losses = [step["loss"].item() for step in two_workers["steps"]]
    accuracies = [sum(step["all_mb_metrics"]["accuracy"]) for step in two_workers["steps"]]
    assert losses[0] == pytest.approx(0.693, abs=0.02)  # a fresh head scores ~0: −log σ(0)
    assert losses[-1] < 0.1 * losses[0], losses  # measured: 0.695 → 0.0013
    assert accuracies[-1] == pytest.approx(1.0)
    assert pair_accuracy(two_workers["initial_held_out"]) < 1.0
    assert pair_accuracy(two_workers["final_held_out"]) == 1.0
    final = two_workers["final_held_out"]
    assert (final[0::2] - final[1::2]).min() > 1.0


def test_microbatch_metrics_cover_every_pair(two_workers: dict) -> None:
    metrics = two_workers["steps"][0]["all_mb_metrics"]
    # 16 rows / 2 ranks / microbatches of 4 = 2 microbatches per rank.
    assert len(metrics["loss"]) == 4 and sum(metrics["num_valid_samples"]) == 8
    assert set(metrics["global_valid_seqs"]) == {16} and set(metrics["global_valid_toks"]) == {0}
    assert sum(metrics["loss"]) == pytest.approx(two_workers["steps"][0]["loss"].item(), abs=1e-6)


# ---------------------------------------------------------------------------- checkpoints
def test_one_worker_resumed_from_two_workers_gives_the_same_scores_and_step(
    one_worker: dict, two_workers: dict
) -> None:
    """Weights, optimizer state and scheduler carry over to another DP size."""
    torch.testing.assert_close(one_worker["held_out"], two_workers["final_held_out"], atol=1e-5, rtol=0)
    resumed, original = one_worker["next_step"], two_workers["next_step"]
    assert resumed["loss"].item() == pytest.approx(original["loss"].item(), abs=1e-6)
    assert resumed["grad_norm"].item() == pytest.approx(original["grad_norm"].item(), abs=1e-5)


def test_dynamic_batching_scores_in_input_order(one_worker: dict, two_workers: dict) -> None:
    torch.testing.assert_close(one_worker["dynamic_held_out"], two_workers["final_held_out"], atol=1e-5, rtol=0)
    message = "train: policy.dynamic_batching.enabled sorts rows by length, which separates a reward model's"
    assert message in str(one_worker["dynamic_train_error"])


def test_hf_export_reloads_as_a_sequence_classifier_with_identical_scores(
    two_workers: dict, held_out_batch: BatchedDataDict
) -> None:
    exported: Path = two_workers["checkpoint"] / "hf"
    assert (exported / "pytorch_model.bin").is_file() and not list(exported.glob("*.safetensors"))
    model = AutoModelForSequenceClassification.from_pretrained(exported, dtype=torch.float32)
    assert type(model).__name__ == "LlamaForSequenceClassification" and model.config.num_labels == 1
    assert model.config.architectures == ["LlamaForSequenceClassification"]
    torch.testing.assert_close(
        hf_last_token_scores(model, held_out_batch), two_workers["final_held_out"], atol=1e-5, rtol=0
    )


# ---------------------------------------------------------------------------- errors
def test_language_model_methods_raise_a_clear_error(two_workers: dict) -> None:
    errors = two_workers["errors"]
    for method in ("get_logprobs", "get_reference_policy_logprobs", "get_full_state_dict_for_refit"):
        assert isinstance(errors[method], RuntimeError)
        assert str(errors[method]).startswith(f"Policy.{method} is not available for a reward model")
        assert "use Policy.score(data)" in str(errors[method])
    assert isinstance(errors["train_without_lengths"], KeyError)
    assert "train: data is missing ['input_lengths']" in str(errors["train_without_lengths"])
    assert "score: input_lengths[3] = " in str(errors["lengths_out_of_range"])
    assert "is outside [1, " in str(errors["lengths_out_of_range"])
    assert "the micro batch size (1) must both be even" in str(errors["odd_micro_batch"])


def test_unknown_reward_model_type_is_refused(model_path: str, tokenizer: Any) -> None:
    message = "reward_model_cfg.reward_model_type: must be one of ['bradley_terry', 'regression'], got 'pairwise'"
    config = rm_config(model_path, reward_model_cfg=RewardModelConfig(enabled=True, reward_model_type="pairwise"))
    with pytest.raises(ValueError) as raised:  # a PolicyConfig was validated at load; a mapping is validated here
        Policy(None, config_to_dict(config), tokenizer)  # fails on the config, before the cluster is touched
    assert f"policy.{message}" in str(raised.value)
    with pytest.raises(ConfigError) as raised:
        validate_config({"reward_model_cfg": {"enabled": True, "reward_model_type": "pairwise"}}, PolicyConfig)
    assert message in str(raised.value)
