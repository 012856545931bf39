"""NeMo-RL's loss_fn variants: KL estimator types and clamps, truncated importance sampling types, CISPO, and the
keys refused with one line. Numbers are hand-computed; batches come from `test_loss_functions.uniform_batch`
(lp = −log 4 everywhere, other logprobs set as shifts from it)."""

import math

import pytest
import torch

from nemo_rl_clone.algorithms.loss import ClippedPGLossFn, NLLLossFn, PreferenceLossFn
from nemo_rl_clone.algorithms.utils import calculate_kl
from nemo_rl_clone.distributed.model_utils import valid_counts
from tests.unit.test_loss_functions import LOG4, NEMO_RL_LOSS_CFG, call, pg_loss, uniform_batch

D = [1.0, -1.0, 0.0, 2.0]  # d = lp_ref − lp per token


@pytest.mark.parametrize(
    ("kl_type", "per_token"),
    [
        ("k1", [-d for d in D]),
        ("k2", [d * d / 2 for d in D]),
        ("k3", [math.exp(d) - d - 1 for d in D]),
    ],
)
def test_calculate_kl_estimators_hand_values(kl_type, per_token):
    lp = torch.zeros(4, dtype=torch.float64)
    result = calculate_kl(lp, torch.tensor(D, dtype=torch.float64), kl_type, None, None)
    torch.testing.assert_close(result, torch.tensor(per_token, dtype=torch.float64), atol=1e-12, rtol=0)


def test_calculate_kl_input_and_output_clamps():
    lp = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([5.0, -5.0, 0.5], dtype=torch.float64)
    # input clamp 1: d → [1, −1, 0.5]; k3 → [e − 2, e⁻¹, e^0.5 − 1.5]; output clamp 0.5 caps the first
    result = calculate_kl(lp, ref, "k3", input_clamp_value=1.0, output_clamp_value=0.5)
    expected = [0.5, math.exp(-1.0), math.exp(0.5) - 1.5]
    torch.testing.assert_close(result.detach(), torch.tensor(expected, dtype=torch.float64), atol=1e-12, rtol=0)
    result.sum().backward()
    # clamped entries pass no gradient; d(k3)/d(lp) = 1 − e^d for the unclamped third
    torch.testing.assert_close(lp.grad, torch.tensor([0.0, 0.0, 1 - math.exp(0.5)], dtype=torch.float64))
    with pytest.raises(ValueError, match="kl_type must be one of"):
        calculate_kl(lp, ref, "k4")


def test_calculate_kl_importance_weights_go_in_before_the_output_clamp():
    """NeMo-RL v0.7.0's `importance_sampling_weights`: the result is clamp(w·k), and w is detached where the input
    clamp binds, so neither clamped token passes a gradient to w or lp."""
    lp = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    w = torch.tensor([2.0, 3.0, 0.5], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([5.0, 0.8, 0.5], dtype=torch.float64)
    # d → [1 (input-clamped), 0.8, 0.5]; w·k3 → [2(e − 2), 3(e^0.8 − 1.8), 0.5(e^0.5 − 1.5)]; the second exceeds 0.5
    result = calculate_kl(lp, ref, "k3", 1.0, 0.5, importance_sampling_weights=w)
    k3 = [math.e - 2.0, math.exp(0.8) - 1.8, math.exp(0.5) - 1.5]
    expected = [min(2.0 * k3[0], 0.5), 0.5, 0.5 * k3[2]]
    torch.testing.assert_close(result.detach(), torch.tensor(expected, dtype=torch.float64), atol=1e-12, rtol=0)
    result.sum().backward()
    assert lp.grad is not None and w.grad is not None
    torch.testing.assert_close(lp.grad, torch.tensor([0.0, 0.0, 0.5 * (1 - math.exp(0.5))], dtype=torch.float64))
    torch.testing.assert_close(w.grad, torch.tensor([0.0, 0.0, k3[2]], dtype=torch.float64))


@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3"])
def test_loss_uses_the_configured_kl_type_and_default_clamps(kl_type):
    logits, data = uniform_batch([[0.0] * 4], ref_shift=[[1.0, -1.0, 0.0, 12.0]])
    loss, metrics = call(pg_loss(reference_policy_kl_penalty=0.1, reference_policy_kl_type=kl_type), logits, data)
    d = torch.tensor([1.0, -1.0, 0.0, 12.0], dtype=torch.float64)
    per_token = calculate_kl(torch.zeros(4, dtype=torch.float64), d, kl_type, 20.0, 10.0)
    assert per_token.max() <= 10.0  # the default output clamp caps k2 and k3 of d = 12
    assert metrics["kl_penalty"] == pytest.approx(per_token.mean().item(), abs=1e-5)
    assert loss.item() == pytest.approx(0.1 * per_token.mean().item(), abs=1e-6)


# Importance weights w = exp(lp_prev − lp_gen) of [3.0, 0.25, 1.0, 1.5] on one sequence (lp_prev = lp here).
WEIGHTS = [3.0, 0.25, 1.0, 1.5]
GEN_FOR_WEIGHTS = [[-math.log(w) for w in WEIGHTS]]


def is_loss(**overrides):
    return pg_loss(use_importance_sampling_correction=True, **overrides)


def test_tis_clamps_weights_above():
    logits, data = uniform_batch([[1.0] * 4], gen_shift=GEN_FOR_WEIGHTS)
    loss, metrics = call(is_loss(truncated_importance_sampling_ratio=2.0), logits, data)
    # ratio r = 1, A = 1: L = −w per token, w clamped at 2
    assert loss.item() == pytest.approx(-(2.0 + 0.25 + 1.0 + 1.5) / 4, abs=1e-6)
    assert metrics["sampling_importance_ratio"] == pytest.approx((2.0 + 0.25 + 1.0 + 1.5) / 4, abs=1e-6)
    assert "is_oob_ratio" not in metrics


def test_icepop_zeroes_tokens_outside_the_bounds():
    logits, data = uniform_batch([[1.0] * 4], gen_shift=GEN_FOR_WEIGHTS)
    loss_fn = is_loss(
        truncated_importance_sampling_ratio=2.0,
        truncated_importance_sampling_type="icepop",
        truncated_importance_sampling_ratio_min=0.5,
    )
    loss, metrics = call(loss_fn, logits, data)
    assert loss.item() == pytest.approx(-(1.0 + 1.5) / 4, abs=1e-6)  # w = 3 and 0.25 are out of [0.5, 2]
    assert metrics["is_oob_ratio"] == pytest.approx(0.5, abs=1e-6)


def test_seq_mask_tis_drops_whole_sequences_by_geometric_mean():
    # sequence 0: w = WEIGHTS (geometric mean (3·0.25·1·1.5)^(1/4) ≈ 1.03); sequence 1: all w = 3 (mean 3)
    logits, data = uniform_batch([[1.0] * 4, [1.0] * 4], gen_shift=[*GEN_FOR_WEIGHTS, [-math.log(3.0)] * 4])
    loss_fn = is_loss(
        truncated_importance_sampling_ratio=2.0,
        truncated_importance_sampling_type="seq-mask-tis",
        truncated_importance_sampling_ratio_min=0.5,
    )
    loss, metrics = call(loss_fn, logits, data)
    # sequence 0 is kept with its raw (untruncated) weights; sequence 1 is zeroed
    assert loss.item() == pytest.approx(-sum(WEIGHTS) / 8, abs=1e-6)
    assert metrics["is_oob_ratio"] == pytest.approx(0.5, abs=1e-6)


def test_cispo_value_and_gradient():
    ratios = [1.5, 0.5, 1.1]
    advantages = [[1.0, -1.0, 2.0]]
    logits, data = uniform_batch(advantages, prev_shift=[[-math.log(r) for r in ratios]])
    loss, metrics = call(pg_loss(use_cispo=True, ratio_clip_min=0.2, ratio_clip_max=0.2), logits, data)
    clipped = [1.2, 0.8, 1.1]
    # L = −sg(clip(r))·A·lp with lp = −log 4
    assert loss.item() == pytest.approx(
        sum(c * a * LOG4 for c, a in zip(clipped, advantages[0], strict=True)) / 3, abs=1e-6
    )
    assert metrics["probs_ratio_clamped"] == pytest.approx(sum(clipped) / 3, abs=1e-6)
    loss.backward()
    # unlike PPO's clip, every token keeps a gradient: dL/dlp = −clip(r)·A / N
    grad_lp = torch.tensor([-c * a / 3 for c, a in zip(clipped, advantages[0], strict=True)])
    expected = grad_lp[:, None] * (torch.eye(4)[0] - 0.25)
    torch.testing.assert_close(logits.grad[0, :3], expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            {"positive_example_nll_weight": 0.1},
            "positive_example_nll_weight: not supported yet: VAPO's NLL term on positive examples; set it to 0.0",
        ),
        (
            {"use_kl_in_reward": True},
            "use_kl_in_reward: not supported yet: the KL penalty is a loss term here (reference_policy_kl_penalty); "
            "set it to false",
        ),
        ({"use_cispo": True, "disable_ppo_ratio": True}, "use_cispo: CISPO clips the token ratio itself"),
        (
            {
                "use_importance_sampling_correction": True,
                "truncated_importance_sampling_ratio": 2.0,
                "truncated_importance_sampling_type": "icepop",
            },
            "truncated_importance_sampling_ratio_min: required with type 'icepop'",
        ),
        (
            {"truncated_importance_sampling_ratio_min": 0.5},
            "truncated_importance_sampling_ratio_min: only used by truncated_importance_sampling_type",
        ),
        ({"reference_policy_kl_type": "k4"}, "reference_policy_kl_type: must be one of"),
        ({"kl_output_clamp_value": 0.0}, "kl_output_clamp_value: must be > 0 or null, got 0.0"),
    ],
)
def test_refused_settings_name_the_key(overrides, line):
    with pytest.raises(ValueError, match="invalid ClippedPGLossFn config") as error:
        ClippedPGLossFn({**NEMO_RL_LOSS_CFG, **overrides})
    assert line in str(error.value)


def test_nemo_rl_v07_loss_defaults_validate():
    cfg = {
        **NEMO_RL_LOSS_CFG,
        "reference_policy_kl_type": "k3",
        "kl_input_clamp_value": 20.0,
        "kl_output_clamp_value": 10.0,
        "truncated_importance_sampling_type": "tis",
        "truncated_importance_sampling_ratio_min": None,
        "use_cispo": False,
        "positive_example_nll_weight": 0.0,
        "use_kl_in_reward": False,
        "disable_ppo_ratio": False,
        "force_on_policy_ratio": False,
    }
    assert ClippedPGLossFn(cfg).cfg.reference_policy_kl_type == "k3"


def test_nll_loss_dpo_mode_returns_per_row_sums_or_means():
    logits, data = uniform_batch([[0.0] * 3, [0.0] * 3], token_mask=[[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss_fn = NLLLossFn()
    summed, metrics = call_nll(loss_fn, logits, data, dpo_loss=True)
    torch.testing.assert_close(summed, torch.tensor([2 * LOG4, 3 * LOG4]))
    assert metrics["loss"] == pytest.approx(5 * LOG4, abs=1e-5)
    averaged, _ = call_nll(loss_fn, logits, data, dpo_loss=True, dpo_average_log_probs=True)
    torch.testing.assert_close(averaged, torch.tensor([LOG4, LOG4]))
    token_mean, metrics = call_nll(loss_fn, logits, data)
    assert token_mean.item() == pytest.approx(LOG4, abs=1e-6) and metrics["num_unmasked_tokens"] == 5


def call_nll(loss_fn, logits, data, **kwargs):
    seqs, toks = valid_counts(data)
    return loss_fn(logits, data, seqs, toks, None, None, None, **kwargs)


def test_preference_loss_split_output_tensor():
    chosen, rejected = PreferenceLossFn().split_output_tensor(torch.arange(6))
    assert chosen.tolist() == [0, 2, 4] and rejected.tolist() == [1, 3, 5]


@pytest.mark.parametrize(
    "overrides,problem",
    [
        (
            {"truncated_importance_sampling_type": "icepop", "use_importance_sampling_correction": True},
            "truncated_importance_sampling_type: 'icepop' needs truncated_importance_sampling_ratio (> 0)",
        ),
        (
            {"truncated_importance_sampling_type": "seq-mask-tis", "use_importance_sampling_correction": True},
            "truncated_importance_sampling_type: 'seq-mask-tis' needs truncated_importance_sampling_ratio (> 0)",
        ),
        ({"use_cispo": True, "ratio_clip_c": 3.0}, "ratio_clip_c: dual clipping does not apply to CISPO's loss"),
        ({"disable_ppo_ratio": True, "ratio_clip_c": 3.0}, "ratio_clip_c: dual clipping bounds the PPO ratio"),
        ({"use_cispo": True, "token_level_loss": False}, "use_cispo: CISPO needs token_level_loss=true"),
    ],
    ids=["icepop_without_ratio", "seq_mask_tis_without_ratio", "cispo_dual_clip", "reinforce_dual_clip", "cispo_seq"],
)
def test_combinations_nemo_rl_refuses_are_refused(overrides, problem):
    """What NeMo-RL v0.7.0 refuses fails validation with one line naming the key (it would otherwise be ignored)."""
    with pytest.raises(ValueError) as err:
        ClippedPGLossFn({**NEMO_RL_LOSS_CFG, **overrides})
    assert problem in str(err.value), str(err.value)
