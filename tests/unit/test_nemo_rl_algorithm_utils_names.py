"""NeMo-RL v0.7.0's algorithm helpers at its paths (issue 53): ``algorithms.utils``, ``advantage_estimator``,
``logits_sampling_utils`` and ``loss``; hand-computed values on tiny inputs, NeMo-RL's behaviour."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from nemo_rl_clone.algorithms import advantage_estimator as estimators
from nemo_rl_clone.algorithms.logits_sampling_utils import apply_top_k_top_p, need_top_k_or_top_p_filtering
from nemo_rl_clone.algorithms.loss import loss_functions
from nemo_rl_clone.algorithms.loss.interfaces import LossInputType
from nemo_rl_clone.algorithms.ppo.config import GAEConfig
from nemo_rl_clone.algorithms.utils import get_gdpo_reward_component_keys, masked_var, maybe_pad_last_batch
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.utils.config_validation import ConfigError
from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.utils.unsupported_modules import UnsupportedFeatureError


def test_gdpo_reward_component_keys_in_number_order() -> None:
    batch = {"reward10": 0, "reward2": 0, "reward1": 0, "rewards": 0, "reward": 0, "xreward3": 0, "reward2a": 0}
    assert get_gdpo_reward_component_keys(batch) == ["reward1", "reward2", "reward10"]  # not "reward10" < "reward2"


def test_masked_var_unbiased_biased_and_given_mean() -> None:
    values = torch.tensor([1.0, 2.0, 3.0, 100.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    assert masked_var(values, mask).item() == pytest.approx(1.0)  # Σ(x − 2)² / (3 − 1)
    assert masked_var(values, mask, unbiased=False).item() == pytest.approx(2 / 3)
    assert masked_var(values, mask, mean=0.0).item() == pytest.approx(14 / 3 * 3 / 2)


def test_maybe_pad_last_batch_pads_masked_copies_of_the_last_row() -> None:
    batch = BatchedDataDict(
        input_ids=torch.tensor([[1, 2], [3, 4], [5, 6]]),
        input_lengths=torch.tensor([2, 2, 1]),
        token_mask=torch.tensor([[0, 1], [0, 1], [1, 0]]),
        sample_mask=torch.tensor([1.0, 1.0, 1.0]),
    )
    padded = maybe_pad_last_batch(batch, dp_size=2, mbs=2)
    assert padded is batch and padded.size == 4
    assert padded["input_ids"].tolist() == [[1, 2], [3, 4], [5, 6], [5, 6]]
    assert padded["input_lengths"].tolist() == [2, 2, 1, 1]
    assert padded["token_mask"][-1].tolist() == [1, 0]
    assert padded["sample_mask"].tolist() == [1.0, 1.0, 1.0, 0.0]  # the copy trains nothing
    assert maybe_pad_last_batch(padded, dp_size=2, mbs=1).size == 4  # already a multiple


@pytest.mark.parametrize(
    ("top_k", "top_p", "expected"),
    [(None, 1.0, False), (-1, 1.0, False), (0, 1.0, False), (2, 1.0, True), (None, 0.9, True), (None, None, False)],
)
def test_need_top_k_or_top_p_filtering(top_k: int | None, top_p: float | None, expected: bool) -> None:
    assert need_top_k_or_top_p_filtering(SimpleNamespace(top_k=top_k, top_p=top_p)) is expected
    assert need_top_k_or_top_p_filtering(None) is False


def test_apply_top_k_top_p_keeps_nemo_rls_sets() -> None:
    logits = torch.tensor([0.1, 0.2, 0.3, 0.4]).log().reshape(1, 1, 4)
    filtered, keep = apply_top_k_top_p(logits, top_k=2, top_p=1.0)
    assert keep is not None and keep.tolist() == [[[False, False, True, True]]]
    assert torch.isinf(filtered[..., :2]).all() and torch.equal(filtered[..., 2:], logits[..., 2:])
    assert apply_top_k_top_p(logits, top_k=None, top_p=0.5)[1].tolist() == [[[False, False, True, True]]]
    # top-p over the renormalised top-3 (0.22, 0.33, 0.44): the mass above token 2 is 0.44 ≥ 0.42, so it goes;
    # over the unrenormalised probabilities it would be 0.4 and stay
    assert apply_top_k_top_p(logits, top_k=3, top_p=0.42, chunk_size=1)[1].tolist() == [[[False, False, False, True]]]
    same, none = apply_top_k_top_p(logits, top_k=-1, top_p=1.0)
    assert same is logits and none is None


def test_apply_top_k_top_p_gives_dropped_tokens_no_gradient() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]], requires_grad=True)
    filtered, keep = apply_top_k_top_p(logits, top_k=2, top_p=1.0, chunk_size=1)
    filtered.log_softmax(dim=-1)[:, 0].sum().backward()
    assert logits.grad is not None and keep is not None
    assert (logits.grad[~keep] == 0).all() and (logits.grad[keep] != 0).all()


def test_loss_names() -> None:
    assert [member.value for member in LossInputType] == [
        "logit",
        "logprob",
        "distillation",
        "distillation_cross_tokenizer",
        "draft",
    ]
    assert loss_functions.Tensor is torch.Tensor
    config = loss_functions.MseValueLossConfig(scale=2.0, cliprange=None)
    loss_fn = loss_functions.MseValueLossFn(config)
    values = torch.tensor([[1.0, 3.0]])
    data = {
        "returns": torch.tensor([[2.0, 0.0]]),
        "values": torch.tensor([[1.0, 3.0]]),
        "token_mask": torch.tensor([[1.0, 0.0]]),
        "sample_mask": torch.tensor([1.0]),
    }
    loss, _ = loss_fn(values, data, torch.tensor(1.0), torch.tensor(1.0))
    assert loss.item() == pytest.approx(0.5 * 2.0 * 1.0)  # ½ · scale · (1 − 2)², the masked token ignored
    for name, feature in (
        ("DraftCrossEntropyLossFn", "draft"),
        ("CrossTokenizerDistillationLossFn", "cross-tokenizer"),
    ):
        with pytest.raises(UnsupportedFeatureError, match=feature):
            getattr(loss_functions, name)


def test_raw_reward_advantages() -> None:
    rewards = torch.tensor([1.0, 3.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    plain, returns = estimators.RawRewardAdvantageEstimator({"normalize_advantages": False}, None).compute_advantage(
        torch.tensor([0, 1]), rewards, mask
    )
    assert returns is None and plain.tolist() == [[1.0, 1.0], [3.0, 3.0]]
    whitened, _ = estimators.RawRewardAdvantageEstimator({"normalize_advantages": True}, None).compute_advantage(
        torch.tensor([0, 1]), rewards, mask
    )
    # kept tokens 1, 1, 3: mean 5/3, population variance 8/9
    low, high = -1 / math.sqrt(2), math.sqrt(2)
    assert whitened.tolist() == [[pytest.approx(low), pytest.approx(low)], [pytest.approx(high), pytest.approx(high)]]


def test_generalized_advantage_estimator() -> None:
    config = {"gae_lambda": 1.0, "gae_gamma": 1.0, "normalize_advantages": False}
    config |= {"gae_lambda_value": None, "gae_lambda_policy": None, "length_adaptive_alpha": 0.0}
    values = torch.tensor([[0.5, 0.25, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    estimator = estimators.GeneralizedAdvantageEstimator(config, {"use_kl_in_reward": False})
    advantages, returns = estimator.compute_advantage(torch.tensor([0]), torch.tensor([1.0]), mask, values)
    # reward on the last response token: δ1 = 1 − 0.25, δ0 = 0.25 − 0.5; A0 = δ0 + δ1
    assert advantages.tolist() == [[0.5, 0.75, 0.0]] and returns.tolist() == [[1.0, 1.0, 0.0]]
    one_step = estimators.GeneralizedAdvantageEstimator(config | {"gae_lambda": 0.0}, None)
    assert one_step.compute_advantage(torch.tensor([0]), torch.tensor([1.0]), mask, values)[0].tolist() == [
        [-0.25, 0.75, 0.0]
    ]
    with pytest.raises(ConfigError, match=r"adv_estimator\.gae_lambda"):
        estimators.GeneralizedAdvantageEstimator(config | {"gae_lambda": 2.0}, None)
    with pytest.raises(ConfigError, match=r"adv_estimator\.gae_gamma"):
        estimators.GeneralizedAdvantageEstimator(GAEConfig(gae_gamma=-1.0), None)
    with pytest.raises(UserInputError, match="use_kl_in_reward"):
        estimators.GeneralizedAdvantageEstimator(config, SimpleNamespace(use_kl_in_reward=True))


def test_opd_estimator_is_refused_by_name() -> None:
    with pytest.raises(UnsupportedFeatureError, match="on-policy distillation"):
        from nemo_rl_clone.algorithms.advantage_estimator import OPDAdvantageEstimator  # noqa: F401


# --- SFT / DPO / RM validation in NeMo-RL's form, on a stand-in policy -------------------------------------------

_PREFERENCE_SHARES = ("loss", "sft_loss", "preference_loss", "accuracy", "rewards_chosen_mean", "rewards_rejected_mean")


class _Policy:
    """Records the calls; each batch's loss is looked up by its first token id (which names the batch)."""

    sharding_annotations = SimpleNamespace(get_axis_size=lambda axis: 1)

    def __init__(self, losses: dict[int, float]) -> None:
        self.losses, self.train_calls, self.reference_mbs = losses, [], []

    def prepare_for_training(self) -> None:
        pass

    def get_reference_policy_logprobs(self, batch: BatchedDataDict, micro_batch_size: int) -> dict[str, torch.Tensor]:
        self.reference_mbs.append(micro_batch_size)
        return {"reference_logprobs": torch.full(batch["input_ids"].shape, -1.0)}

    def train(self, batch: BatchedDataDict, loss_fn: object, eval_mode: bool, gbs: int, mbs: int) -> dict:
        assert eval_mode
        self.train_calls.append((batch.size, gbs, mbs))
        loss = self.losses[int(batch["input_ids"][0, 0])]
        metrics = {name: [loss] for name in _PREFERENCE_SHARES}
        metrics["num_valid_samples"] = [float(batch["sample_mask"].sum())]
        return {"all_mb_metrics": metrics, "grad_norm": 0.0}


def _batch(first_token: int, token_mask: list[list[int]]) -> BatchedDataDict:
    rows = len(token_mask)
    ids = torch.full((rows, 3), first_token)
    return BatchedDataDict(
        input_ids=ids,
        input_lengths=torch.full((rows,), 3),
        token_mask=torch.tensor(token_mask),
        sample_mask=torch.ones(rows),
    )


def test_sft_validate_weights_batches_by_valid_tokens_and_pads_the_last() -> None:
    from nemo_rl_clone.algorithms.sft import validate

    policy = _Policy({1: 1.0, 2: 4.0})
    loader = [_batch(1, [[0, 1, 1], [0, 1, 0]]), _batch(2, [[0, 1, 1]])]  # 3 and 2 valid target tokens
    metrics, timings = validate(policy, loader, None, object(), 0, {}, val_batches=0, val_batch_size=2, val_mbs=2)
    assert metrics == {"val_loss": pytest.approx((1.0 * 3 + 4.0 * 2) / 5)}  # by samples it would be 2.0
    assert timings["total_validation_time"] >= 0
    assert policy.train_calls == [(2, 2, 2), (2, 2, 2)]  # the short batch padded to a micro-batch
    first_only, _ = validate(_Policy({1: 1.0}), loader, None, object(), 0, {}, 1, 2, 2)
    assert first_only == {"val_loss": pytest.approx(1.0)}
    assert validate(policy, None, None, object(), 0, {}, 0, 2, 2) == ({}, {})


def test_dpo_reference_logprobs_and_validation_per_named_set() -> None:
    from nemo_rl_clone.algorithms.dpo import DPOValMetrics, add_ref_logprobs_to_data, validate, validate_one_dataset

    config = {"dpo": {"val_micro_batch_size": 1}, "policy": {"train_micro_batch_size": 2}}
    policy = _Policy({1: 0.5, 2: 1.5})
    trained = list(add_ref_logprobs_to_data([_batch(1, [[0, 1, 1]] * 4)], policy, config))
    assert policy.reference_mbs == [4] and trained[0]["reference_policy_logprobs"].shape == (4, 3)
    short = list(add_ref_logprobs_to_data([_batch(2, [[0, 1, 1]] * 3)], policy, config, is_val=True))
    assert policy.reference_mbs[-1] == 2 and short[0]["sample_mask"].tolist() == [1, 1, 1, 0]

    logged: list[tuple[dict, int, str]] = []
    logger = SimpleNamespace(log_metrics=lambda metrics, step, prefix: logged.append((metrics, step, prefix)))
    loaders = {"a": [_batch(1, [[0, 1, 1]] * 2)], "b": [_batch(2, [[0, 1, 0]] * 2)]}
    metrics, timings = validate(policy, loaders, None, object(), 7, config, 0, 1, 1, logger)
    assert metrics["validation-a_loss"] == 0.5 and metrics["validation-b_accuracy"] == 1.5
    assert metrics["validation-a_global_valid_toks"] == 4 and metrics["validation-b_global_valid_seqs"] == 2
    assert timings["total_validation_time"] == pytest.approx(
        timings["validation-a_total_validation_time"] + timings["validation-b_total_validation_time"]
    )
    assert ("validation-a", 7) in {(prefix, step) for _, step, prefix in logged}
    one = validate_one_dataset(policy, loaders["a"], object(), 7, config, 0, 1, 1, "a")
    assert one is not None and isinstance(one[0], DPOValMetrics) and one[0].num_valid_samples == 2
    assert validate_one_dataset(policy, None, object(), 7, config, 0, 1, 1, "a") is None


def test_rm_validate_one_dataset() -> None:
    from nemo_rl_clone.algorithms.rm import RMValMetrics, validate_one_dataset

    result = validate_one_dataset(_Policy({3: 2.0}), [_batch(3, [[0, 1, 1]] * 2)], object(), 0, {}, 0, 1, 1, "x")
    assert result is not None
    assert result[0] == RMValMetrics(
        loss=2.0, accuracy=2.0, rewards_chosen_mean=2.0, rewards_rejected_mean=2.0, num_valid_samples=2.0
    )


def test_distillation_names() -> None:
    from transformers import PreTrainedTokenizerBase

    from nemo_rl_clone.algorithms.distillation import DistillationSaveState, TokenizerType
    from nemo_rl_clone.algorithms.run.state import RunState

    assert DistillationSaveState is RunState  # what a distillation checkpoint's training_info.json holds
    assert DistillationSaveState().training_info()["step"] == 0
    assert TokenizerType.__bound__ is PreTrainedTokenizerBase


# --- loss wrappers: packed logits give the loss of the padded rows ----------------------------------------------


def _packed_case() -> tuple[torch.Tensor, BatchedDataDict, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 5)
    data = BatchedDataDict(
        input_ids=torch.tensor([[1, 2, 3, 0], [4, 3, 2, 1]]),
        input_lengths=torch.tensor([3, 4]),
        token_mask=torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1]]),
        sample_mask=torch.tensor([1.0, 1.0]),
    )
    junk = torch.full((1, 5), 50.0)
    # padded layout: sample 0 at 0..2, one padding column, sample 1 at 4..7, one padding column
    packed = torch.cat([logits[0, :3], junk, logits[1], junk]).unsqueeze(0).requires_grad_()
    return logits, data, packed, torch.tensor([0, 4, 9])


def test_sequence_packing_wrappers_match_the_padded_loss() -> None:
    from nemo_rl_clone.algorithms.loss import NLLLossFn
    from nemo_rl_clone.algorithms.loss.utils import prepare_loss_input, prepare_packed_loss_input
    from nemo_rl_clone.algorithms.loss.wrapper import (
        SequencePackingFusionLossWrapper,
        SequencePackingLossWrapper,
        wrap_loss_fn_with_input_preparation,
    )

    logits, data, packed, padded_bounds = _packed_case()
    loss_fn, bounds = NLLLossFn(), torch.tensor([0, 3, 7])
    valid_toks = (data["token_mask"][:, 1:] * data["sample_mask"][:, None]).sum()
    counts = (torch.tensor(2.0), valid_toks)
    expected, expected_metrics = wrap_loss_fn_with_input_preparation(logits, data, *counts, loss_fn, prepare_loss_input)
    per_sample = SequencePackingLossWrapper(loss_fn, prepare_loss_input, bounds, padded_bounds)
    fused = SequencePackingFusionLossWrapper(loss_fn, prepare_packed_loss_input, bounds, padded_bounds)
    for wrapper in (per_sample, fused):
        loss, metrics = wrapper(packed, data, *counts)
        assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
        assert metrics["num_unmasked_tokens"] == expected_metrics["num_unmasked_tokens"] == valid_toks == 4
    loss.backward()
    assert packed.grad is not None
    assert (packed.grad[0, [3, 8]] == 0).all() and packed.grad[0, 1].abs().sum() > 0  # padding columns: no gradient
    with pytest.raises(UnsupportedFeatureError, match="draft"):
        from nemo_rl_clone.algorithms.loss.wrapper import DraftLossWrapper  # noqa: F401
