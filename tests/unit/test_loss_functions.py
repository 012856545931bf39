"""Losses of `algorithms/loss/loss_functions.py` against hand-computed numbers and independent loop-based references.

Hand-computed tests use uniform logits over a vocab of 4, so every token's current logprob is exactly −log 4
and the other logprobs are set relative to it (e.g. prev_logprobs = lp − log r gives the ratio r).
"""

import math

import pytest
import torch

from nemo_rl_clone.algorithms.loss import (
    ClippedPGLossFn,
    DPOLossFn,
    LossType,
    NLLLossFn,
    PreferenceLossFn,
)
from nemo_rl_clone.contract.logprobs import token_logprobs_from_logits
from nemo_rl_clone.distributed.model_utils import valid_counts

LOG4 = math.log(4.0)

# `loss_fn` of NeMo-RL's grpo_math_1B.yaml, as its users write it.
NEMO_RL_LOSS_CFG = {
    "reference_policy_kl_penalty": 0.01,
    "ratio_clip_min": 0.2,
    "ratio_clip_max": 0.2,
    "ratio_clip_c": None,
    "use_on_policy_kl_approximation": False,
    "use_importance_sampling_correction": False,
    "truncated_importance_sampling_ratio": None,
    "sequence_level_importance_ratios": False,
    "token_level_loss": True,
}
# `dpo` loss keys of NeMo-RL's dpo.yaml.
NEMO_RL_DPO_CFG = {
    "reference_policy_kl_penalty": 0.05,
    "preference_average_log_probs": False,
    "sft_average_log_probs": False,
    "preference_loss_weight": 1,
    "sft_loss_weight": 0,
}


def pg_loss(**overrides) -> ClippedPGLossFn:
    return ClippedPGLossFn({**NEMO_RL_LOSS_CFG, "reference_policy_kl_penalty": 0.0, **overrides})


def spec_layout(per_token: torch.Tensor) -> torch.Tensor:
    """[B, S-1] per-predicted-token values → the policy's [B, S] layout (position 0 holds 0)."""
    return torch.cat([torch.zeros(per_token.shape[0], 1, dtype=per_token.dtype), per_token], dim=1)


def uniform_batch(advantages, prev_shift=None, gen_shift=None, ref_shift=None, token_mask=None, sample_mask=None):
    """Logits giving lp = −log 4 everywhere; X_shift[b][t] sets X_logprobs = lp + shift at predicted token t."""
    advantages = torch.tensor(advantages, dtype=torch.float32)
    batch, tokens = advantages.shape
    lp = torch.full((batch, tokens), -LOG4)

    def shifted(shift):
        return spec_layout(lp + (torch.zeros_like(lp) if shift is None else torch.tensor(shift, dtype=torch.float32)))

    logits = torch.zeros(batch, tokens + 1, 4, requires_grad=True)
    data = {
        "input_ids": torch.zeros(batch, tokens + 1, dtype=torch.long),
        "token_mask": spec_layout(torch.ones(batch, tokens) if token_mask is None else torch.tensor(token_mask)),
        "sample_mask": torch.ones(batch) if sample_mask is None else torch.tensor(sample_mask, dtype=torch.float32),
        "advantages": spec_layout(advantages),
        "prev_logprobs": shifted(prev_shift),
        "generation_logprobs": shifted(gen_shift if gen_shift is not None else prev_shift),
        "reference_policy_logprobs": shifted(ref_shift),
    }
    return logits, data


def call(loss_fn, logits, data):
    seqs, toks = valid_counts(data)
    return loss_fn(logits, data, seqs, toks)


# Four tokens with ratios 1.5, 0.5, 1.5, 0.5 (prev = lp − log r) and advantages +1, +1, −1, −1.
RATIOS = [[1.5, 0.5, 1.5, 0.5]]
PREV_FOR_RATIOS = [[-math.log(r) for r in RATIOS[0]]]
CLIP_ADVANTAGES = [[1.0, 1.0, -1.0, -1.0]]


def test_ppo_clipping_on_both_sides_value_and_gradient():
    logits, data = uniform_batch(CLIP_ADVANTAGES, prev_shift=PREV_FOR_RATIOS)
    loss, metrics = call(pg_loss(), logits, data)
    # L = max(−A·r, −A·clip(r, 0.8, 1.2)): [−1.2, −0.5, 1.5, 0.8]
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 1.5 + 0.8) / 4, abs=1e-6)
    assert metrics["probs_ratio"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["probs_ratio_clamped"] == pytest.approx((1.2 + 0.8 + 1.2 + 0.8) / 4, abs=1e-6)
    loss.backward()
    # dL/dlp: 0 where the clipped branch wins, −A·r where the unclipped one does.
    grad_lp = torch.tensor([0.0, -0.5, 1.5, 0.0]) / 4
    softmax_minus_target = torch.full((4, 4), 0.25) - torch.eye(4)[0]
    expected = -grad_lp[:, None] * softmax_minus_target  # d lp / d logits = onehot − softmax
    torch.testing.assert_close(logits.grad[0, :4], expected, atol=1e-7, rtol=0)
    assert logits.grad[0, 4].abs().max() == 0  # the last position predicts nothing


def test_asymmetric_clip_higher():
    logits, data = uniform_batch([[1.0, -1.0]], prev_shift=[[-math.log(1.5), -math.log(0.5)]])
    loss, _ = call(pg_loss(ratio_clip_min=0.1, ratio_clip_max=0.28), logits, data)
    # A=+1, r=1.5 → −1.28; A=−1, r=0.5 → max(0.5, 0.9) = 0.9
    assert loss.item() == pytest.approx((-1.28 + 0.9) / 2, abs=1e-6)


def test_dual_clip_bounds_negative_advantage_tokens():
    logits, data = uniform_batch(CLIP_ADVANTAGES, prev_shift=PREV_FOR_RATIOS)
    loss, _ = call(pg_loss(ratio_clip_c=1.4), logits, data)
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 1.4 + 0.8) / 4, abs=1e-6)  # token 3: min(1.5, 1.4)
    loss_wide, _ = call(pg_loss(ratio_clip_c=3.0), logits, data)
    assert loss_wide.item() == pytest.approx((-1.2 - 0.5 + 1.5 + 0.8) / 4, abs=1e-6)


def test_reinforce_mode_is_minus_advantage_times_logprob():
    logits, data = uniform_batch([[2.0, 1.0, -1.0, 0.5]], prev_shift=PREV_FOR_RATIOS)
    loss, metrics = call(pg_loss(disable_ppo_ratio=True), logits, data)
    assert loss.item() == pytest.approx(2.5 * LOG4 / 4, abs=1e-6)  # −Σ A·lp / 4 with lp = −log 4
    assert metrics["probs_ratio"] == pytest.approx(1.0, abs=1e-6)  # reported, unclipped, not used
    loss.backward()
    expected = -torch.tensor([2.0, 1.0, -1.0, 0.5])[:, None] / 4 * (torch.eye(4)[0] - 0.25)
    torch.testing.assert_close(logits.grad[0, :4], expected, atol=1e-7, rtol=0)


KL_SHIFTS = [[1.0, -1.0, 0.0, 2.0]]  # d = lp_ref − lp
K3 = [math.e - 2.0, math.exp(-1.0), 0.0, math.exp(2.0) - 3.0]


def test_k3_kl_penalty():
    logits, data = uniform_batch([[0.0] * 4], ref_shift=KL_SHIFTS)
    loss, metrics = call(pg_loss(reference_policy_kl_penalty=0.1), logits, data)
    assert loss.item() == pytest.approx(0.1 * sum(K3) / 4, abs=1e-6)
    assert metrics["kl_penalty"] == pytest.approx(sum(K3) / 4, abs=1e-6)


def test_k3_kl_with_on_policy_approximation():
    weights = [2.0, 0.5, 1.0, 4.0]  # exp(lp − lp_gen)
    logits, data = uniform_batch([[0.0] * 4], gen_shift=[[-math.log(w) for w in weights]], ref_shift=KL_SHIFTS)
    loss_fn = pg_loss(reference_policy_kl_penalty=0.1, use_on_policy_kl_approximation=True)
    loss, _ = call(loss_fn, logits, data)
    # NeMo-RL v0.7.0: the output clamp (10) applies to w·k3, so the last token's 4·(e² − 3) = 17.6 counts as 10.
    weighted = [min(w * k, 10.0) for w, k in zip(weights, K3, strict=True)]
    assert weighted[-1] == 10.0
    assert loss.item() == pytest.approx(0.1 * sum(weighted) / 4, abs=1e-6)
    loss.backward()
    # The weight w = exp(lp − lp_gen) is not detached (score-function term): d/dlp of w·k3 = w·k3 + w·(1 − e^d);
    # the clamped last token passes none.
    grad_lp = torch.tensor(
        [w * (k + 1 - math.exp(d)) for w, k, d in zip(weights[:3], K3, KL_SHIFTS[0], strict=False)] + [0.0]
    )
    grad_lp = grad_lp * 0.1 / 4
    torch.testing.assert_close(logits.grad[0, :4], -grad_lp[:, None] * (0.25 - torch.eye(4)[0]), atol=1e-6, rtol=0)


IS_WEIGHTS = [2.0, 0.5, 4.0, 1.0]  # exp(lp_prev − lp_gen)


def test_importance_sampling_correction_and_truncation():
    gen_shift = [[-math.log(w) for w in IS_WEIGHTS]]
    logits, data = uniform_batch([[1.0] * 4], gen_shift=gen_shift)  # r = 1 so L = −A = −1
    loss, _ = call(pg_loss(use_importance_sampling_correction=True), logits, data)
    assert loss.item() == pytest.approx(-sum(IS_WEIGHTS) / 4, abs=1e-6)
    truncated, _ = call(
        pg_loss(use_importance_sampling_correction=True, truncated_importance_sampling_ratio=1.5), logits, data
    )
    assert truncated.item() == pytest.approx(-(1.5 + 0.5 + 1.5 + 1.0) / 4, abs=1e-6)
    uncorrected, _ = call(pg_loss(), logits, data)
    assert uncorrected.item() == pytest.approx(-1.0, abs=1e-6)


def test_importance_weight_nan_becomes_zero():
    gen_shift = [[-math.log(w) for w in IS_WEIGHTS]]
    logits, data = uniform_batch([[1.0] * 4], gen_shift=gen_shift)
    data["generation_logprobs"][0, 2] = float("nan")  # predicted token 1
    loss, _ = call(pg_loss(use_importance_sampling_correction=True), logits, data)
    assert loss.item() == pytest.approx(-(2.0 + 4.0 + 1.0) / 4, abs=1e-6)


def test_gspo_sequence_ratio_with_sequence_level_loss():
    # Row 0: 2 tokens with ratios 2 and 1 → r = sqrt(2), clipped to 1.2 for A = +1 → L = −1.2.
    # Row 1: 3 tokens with ratio 0.9 → r = 0.9, A = −1 → L = 0.9 (inside the clip range).
    logits, data = uniform_batch(
        [[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]],
        prev_shift=[[-math.log(2.0), 0.0, 5.0], [-math.log(0.9)] * 3],
        token_mask=[[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]],
    )
    loss_fn = pg_loss(sequence_level_importance_ratios=True, token_level_loss=False)
    assert loss_fn.loss_type == LossType.SEQUENCE_LEVEL
    loss, metrics = call(loss_fn, logits, data)
    assert loss.item() == pytest.approx((-1.2 + 0.9) / 2, abs=1e-6)
    assert metrics["probs_ratio"] == pytest.approx((2 * math.sqrt(2.0) + 3 * 0.9) / 5, abs=1e-6)


def test_gspo_importance_weight_is_per_sequence_product():
    logits, data = uniform_batch([[1.0, 1.0]], gen_shift=[[-math.log(2.0), -math.log(0.25)]])
    loss_fn = pg_loss(
        sequence_level_importance_ratios=True, token_level_loss=False, use_importance_sampling_correction=True
    )
    loss, _ = call(loss_fn, logits, data)
    assert loss.item() == pytest.approx(-0.5, abs=1e-6)  # w = 2 · 0.25 on both tokens, L = −1


def test_token_versus_sequence_normalisation():
    # Row 0: one token with L = −2; row 1: three tokens with L = −1 (r = 1, L = −A).
    kwargs = {"token_mask": [[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]}
    logits, data = uniform_batch([[2.0, 7.0, 7.0], [1.0, 1.0, 1.0]], **kwargs)
    token_level, _ = call(pg_loss(), logits, data)
    sequence_level, _ = call(pg_loss(token_level_loss=False), logits, data)
    assert token_level.item() == pytest.approx((-2.0 - 3.0) / 4, abs=1e-6)
    assert sequence_level.item() == pytest.approx((-2.0 - 1.0) / 2, abs=1e-6)


def test_metrics_hand_values():
    gen_gap = [0.5, -0.25, 0.0, 1.0]  # lp_gen − lp_prev
    logits, data = uniform_batch([[0.0] * 4], gen_shift=[gen_gap])
    _, metrics = call(pg_loss(), logits, data)
    assert metrics["token_mult_prob_error"] == pytest.approx(sum(math.exp(abs(g)) for g in gen_gap) / 4, abs=1e-6)
    # gen_kl_error: k3 with d = lp_prev − lp_gen = −g
    assert metrics["gen_kl_error"] == pytest.approx(sum(math.exp(-g) + g - 1 for g in gen_gap) / 4, abs=1e-6)
    # approx_entropy: −exp(lp − lp_gen)·lp with lp = lp_prev = −log 4
    assert metrics["approx_entropy"] == pytest.approx(sum(math.exp(-g) * LOG4 for g in gen_gap) / 4, abs=1e-6)
    # policy_kl_error: k3 with d = lp_gen − lp_prev = g
    assert metrics["policy_kl_error"] == pytest.approx(sum(math.exp(g) - g - 1 for g in gen_gap) / 4, abs=1e-6)
    # js_divergence_error: ½ Σ_{x ∈ prev, gen} k3 with d = x − log m, m = ½(p_prev + p_gen) (lp_prev = −log 4)
    js = 0.0
    for g in gen_gap:
        lp_prev, lp_gen = -LOG4, -LOG4 + g
        log_m = math.log(0.5 * math.exp(lp_prev) + 0.5 * math.exp(lp_gen))
        js += sum(0.5 * (math.exp(x - log_m) - (x - log_m) - 1) for x in (lp_prev, lp_gen))
    assert metrics["js_divergence_error"] == pytest.approx(js / 4, abs=1e-6)
    assert metrics["sampling_importance_ratio"] == pytest.approx(sum(math.exp(-g) for g in gen_gap) / 4, abs=1e-6)
    assert metrics["num_valid_samples"] == 1
    assert set(metrics) == {
        "loss",
        "probs_ratio",
        "probs_ratio_clamped",
        "kl_penalty",
        "token_mult_prob_error",
        "gen_kl_error",
        "policy_kl_error",
        "js_divergence_error",
        "sampling_importance_ratio",
        "approx_entropy",
        "num_valid_samples",
    }


ALL_BRANCHES = {
    "reference_policy_kl_penalty": 0.1,
    "ratio_clip_c": 3.0,
    "use_on_policy_kl_approximation": True,
    "use_importance_sampling_correction": True,
    "truncated_importance_sampling_ratio": 2.0,
}


def test_masked_and_empty_samples_give_finite_loss_and_gradients():
    logits, data = uniform_batch(
        [[1.0, -1.0, 2.0], [1.0, 1.0, 1.0], [3.0, 3.0, 3.0]],
        prev_shift=[[0.1, -0.2, 0.0]] * 3,
        gen_shift=[[0.3, 0.1, 0.0]] * 3,
        ref_shift=[[0.2, 0.4, 0.0]] * 3,
        token_mask=[[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]],
        sample_mask=[1.0, 1.0, 0.0],
    )
    padding = (data["token_mask"] == 0) | (data["sample_mask"][:, None] == 0)
    padding[:, 0] = False
    for key in ("prev_logprobs", "generation_logprobs", "reference_policy_logprobs"):
        data[key] = data[key].masked_fill(padding, float("-inf"))
    data["advantages"] = data["advantages"].masked_fill(padding, float("nan"))
    only_row0 = {k: v[:1] for k, v in data.items()}
    for overrides in (ALL_BRANCHES, dict(token_level_loss=False, **ALL_BRANCHES), {"disable_ppo_ratio": True}):
        loss_fn = pg_loss(**overrides)
        logits.grad = None
        loss, metrics = call(loss_fn, logits, data)
        loss.backward()
        assert torch.isfinite(logits.grad).all() and all(math.isfinite(v) for v in metrics.values())
        # The masked rows change nothing except (sequence level) the count of valid sequences.
        seqs, toks = valid_counts(data)
        reference, _ = loss_fn(logits[:1].detach(), only_row0, seqs, toks)
        assert loss.item() == pytest.approx(reference.item(), abs=1e-6)


def test_fully_empty_batch_gives_zero_loss_and_gradients():
    logits, data = uniform_batch([[1.0, 1.0]], sample_mask=[0.0])
    loss, metrics = call(pg_loss(**ALL_BRANCHES), logits, data)
    loss.backward()
    assert loss.item() == 0.0 and metrics["num_valid_samples"] == 0
    assert torch.equal(logits.grad, torch.zeros_like(logits))
    assert all(math.isfinite(v) for v in metrics.values())


# ---------- random inputs: loop reference, DP invariance ----------


def random_batch(seed: int, batch: int = 6, seq: int = 7, vocab: int = 11):
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    logits = (2 * randn(batch, seq, vocab)).requires_grad_()
    input_ids = torch.randint(0, vocab, (batch, seq), generator=generator)
    true_lp = reference_logprobs(logits.detach(), input_ids).float()
    token_mask = (torch.rand(batch, seq, generator=generator) > 0.3).float()
    token_mask[1] = 0.0  # a row with no trainable token
    sample_mask = torch.ones(batch)
    sample_mask[2] = 0.0
    prev = true_lp + 0.3 * randn(batch, seq - 1)
    data = {
        "input_ids": input_ids,
        "token_mask": token_mask,
        "sample_mask": sample_mask,
        "advantages": randn(batch, seq),
        "prev_logprobs": spec_layout(prev),
        "generation_logprobs": spec_layout(prev + 0.4 * randn(batch, seq - 1)),
        "reference_policy_logprobs": spec_layout(true_lp + 0.5 * randn(batch, seq - 1)),
    }
    return logits, data


def reference_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """[B, S-1] float64, one position at a time."""
    batch, seq, _ = logits.shape
    out = torch.zeros(batch, seq - 1, dtype=torch.float64)
    for b in range(batch):
        for t in range(seq - 1):
            row = logits[b, t].double()
            out[b, t] = row[input_ids[b, t + 1]] - torch.logsumexp(row, dim=0)
    return out


def reference_clipped_pg(cfg: dict, logits, data) -> float:
    """ClippedPGLossFn's docstring written as plain loops over valid samples and tokens."""
    lp = reference_logprobs(logits.detach(), data["input_ids"]).tolist()
    prev, gen, ref, adv = (
        data[k][:, 1:].double().tolist()
        for k in ("prev_logprobs", "generation_logprobs", "reference_policy_logprobs", "advantages")
    )
    token_mask, sample_mask = data["token_mask"][:, 1:].tolist(), data["sample_mask"].tolist()
    gspo, tis = cfg["sequence_level_importance_ratios"], cfg["truncated_importance_sampling_ratio"]
    actor_total = kl_total = num_seqs = num_toks = 0.0
    for b in range(len(lp)):
        tokens = [t for t in range(len(lp[b])) if token_mask[b][t] and sample_mask[b]]
        if not sample_mask[b]:
            continue
        num_seqs += 1
        num_toks += len(tokens)
        seq_ratio = math.exp(sum(lp[b][t] - prev[b][t] for t in tokens) / max(len(tokens), 1))
        seq_weight = math.exp(sum(prev[b][t] - gen[b][t] for t in tokens))
        actor, kl = [], []
        for t in tokens:
            a = adv[b][t]
            if cfg["disable_ppo_ratio"]:
                loss = -a * lp[b][t]
            else:
                r = seq_ratio if gspo else math.exp(lp[b][t] - prev[b][t])
                clipped = min(max(r, 1 - cfg["ratio_clip_min"]), 1 + cfg["ratio_clip_max"])
                loss = max(-a * r, -a * clipped)
                if cfg["ratio_clip_c"] is not None and a < 0:
                    loss = min(loss, -a * cfg["ratio_clip_c"])
            if cfg["use_importance_sampling_correction"]:
                weight = seq_weight if gspo else math.exp(prev[b][t] - gen[b][t])
                loss *= min(weight, tis) if tis is not None else weight
            d = min(max(ref[b][t] - lp[b][t], -20.0), 20.0)
            k3 = math.exp(d) - d - 1
            if cfg["use_on_policy_kl_approximation"]:
                k3 *= math.exp(lp[b][t] - gen[b][t])
            actor.append(loss)
            kl.append(k3)
        if cfg["token_level_loss"]:
            actor_total, kl_total = actor_total + sum(actor), kl_total + sum(kl)
        elif tokens:
            actor_total, kl_total = actor_total + sum(actor) / len(tokens), kl_total + sum(kl) / len(tokens)
    count = num_toks if cfg["token_level_loss"] else num_seqs
    return (actor_total + cfg["reference_policy_kl_penalty"] * kl_total) / count


PG_CASES = {
    "grpo_default": {},
    "all_token_level": ALL_BRANCHES,
    "sequence_level": dict(token_level_loss=False, **ALL_BRANCHES),
    "gspo": {
        "sequence_level_importance_ratios": True,
        "token_level_loss": False,
        "use_importance_sampling_correction": True,
    },
    "reinforce": {"disable_ppo_ratio": True, "reference_policy_kl_penalty": 0.05},
}


@pytest.mark.parametrize("case", sorted(PG_CASES))
def test_clipped_pg_matches_loop_reference_on_random_inputs(case):
    cfg = {**NEMO_RL_LOSS_CFG, "disable_ppo_ratio": False, **PG_CASES[case]}
    logits, data = random_batch(seed=len(case))
    loss, metrics = call(ClippedPGLossFn(cfg), logits, data)
    expected = reference_clipped_pg(cfg, logits, data)
    assert loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert metrics["loss"] == pytest.approx(loss.item())


@pytest.mark.parametrize("case", sorted(PG_CASES))
def test_loss_and_metrics_of_halves_with_global_counts_sum_to_the_whole(case):
    """Data-parallel invariance: two ranks' shares with global counts add up to the single-rank result."""
    loss_fn = pg_loss(**PG_CASES[case])
    logits, data = random_batch(seed=7)
    seqs, toks = valid_counts(data)
    whole, whole_metrics = loss_fn(logits, data, seqs, toks)
    whole.backward()
    whole_grad, logits.grad = logits.grad.clone(), None
    halves = [
        loss_fn(logits[rows], {k: v[rows] for k, v in data.items()}, seqs, toks) for rows in (slice(0, 3), slice(3, 6))
    ]
    (halves[0][0] + halves[1][0]).backward()
    assert (halves[0][0] + halves[1][0]).item() == pytest.approx(whole.item(), abs=1e-6)
    torch.testing.assert_close(logits.grad, whole_grad, atol=1e-7, rtol=1e-6)
    for key, value in whole_metrics.items():
        assert halves[0][1][key] + halves[1][1][key] == pytest.approx(value, abs=1e-6), key


# ---------- NLL, DPO, preference ----------


def test_nll_matches_cross_entropy_reference():
    logits, data = random_batch(seed=3)
    seqs, toks = valid_counts(data)
    loss, metrics = NLLLossFn()(logits, data, seqs, toks)
    mask = data["token_mask"][:, 1:] * data["sample_mask"][:, None]
    per_token = torch.nn.functional.cross_entropy(
        logits.detach()[:, :-1].double().reshape(-1, 11), data["input_ids"][:, 1:].reshape(-1), reduction="none"
    )
    expected = (per_token * mask.reshape(-1).double()).sum() / mask.sum()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    assert metrics == {
        "loss": pytest.approx(loss.item()),
        "num_unmasked_tokens": mask.sum().item(),
        "num_valid_samples": 5.0,
    }
    assert NLLLossFn.loss_type == LossType.TOKEN_LEVEL


def dpo_batch(seed: int, pairs: int = 3, seq: int = 6, vocab: int = 9):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(2 * pairs, seq, vocab, generator=generator).requires_grad_()
    input_ids = torch.randint(0, vocab, (2 * pairs, seq), generator=generator)
    token_mask = (torch.rand(2 * pairs, seq, generator=generator) > 0.25).float()
    true_lp = reference_logprobs(logits.detach(), input_ids).float()
    data = {
        "input_ids": input_ids,
        "token_mask": token_mask,
        "sample_mask": torch.tensor([1.0, 1.0] * (pairs - 1) + [0.0, 0.0]),  # last pair masked
        "reference_policy_logprobs": spec_layout(true_lp + 0.5 * torch.randn(true_lp.shape, generator=generator)),
    }
    return logits, data


def reference_dpo(cfg: dict, logits, data) -> dict[str, float]:
    lp = reference_logprobs(logits.detach(), data["input_ids"]).tolist()
    ref = data["reference_policy_logprobs"][:, 1:].double().tolist()
    token_mask, sample_mask = data["token_mask"][:, 1:].tolist(), data["sample_mask"].tolist()
    beta = cfg["reference_policy_kl_penalty"]
    pref = sft = 0.0
    pairs = 0
    for i in range(0, len(lp), 2):
        if not sample_mask[i]:
            continue
        pairs += 1
        rewards = []
        for row in (i, i + 1):
            tokens = [t for t in range(len(lp[row])) if token_mask[row][t]]
            reward = sum(lp[row][t] - ref[row][t] for t in tokens)
            rewards.append(reward / max(len(tokens), 1) if cfg["preference_average_log_probs"] else reward)
            if row == i:
                nll = -sum(lp[row][t] for t in tokens)
                sft += nll / max(len(tokens), 1) if cfg["sft_average_log_probs"] else nll
        margin = beta * (rewards[0] - rewards[1])
        pref += math.log1p(math.exp(-margin))  # −log σ(margin)
    pref, sft = pref / pairs, sft / pairs
    loss = cfg["preference_loss_weight"] * pref + cfg["sft_loss_weight"] * sft
    return {"loss": loss, "preference_loss": pref, "sft_loss": sft}


@pytest.mark.parametrize("average", [(False, False), (True, True), (True, False)])
def test_dpo_matches_loop_reference(average):
    cfg = {
        **NEMO_RL_DPO_CFG,
        "preference_average_log_probs": average[0],
        "sft_average_log_probs": average[1],
        "sft_loss_weight": 0.3,
        "preference_loss_weight": 0.7,
        "reference_policy_kl_penalty": 0.5,
    }
    logits, data = dpo_batch(seed=11)
    loss, metrics = call(DPOLossFn(cfg), logits, data)
    expected = reference_dpo(cfg, logits, data)
    # fp32 against a float64 reference: 1e-6 absolute, or relative for the O(10) summed SFT NLL.
    assert loss.item() == pytest.approx(expected["loss"], rel=1e-6, abs=1e-6)
    for key in ("preference_loss", "sft_loss"):
        assert metrics[key] == pytest.approx(expected[key], rel=1e-6, abs=1e-6)
    assert metrics["num_valid_samples"] == 2
    loss.backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[4:].abs().max() == 0  # masked pair: no gradient


def test_dpo_at_policy_equal_reference_is_log2():
    logits, data = dpo_batch(seed=5)
    data["reference_policy_logprobs"] = spec_layout(token_logprobs_from_logits(logits.detach(), data["input_ids"]))
    loss, metrics = call(DPOLossFn(NEMO_RL_DPO_CFG), logits, data)
    assert loss.item() == pytest.approx(0.693147, abs=1e-6)
    assert metrics["accuracy"] == 0.0 and metrics["rewards_chosen_mean"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["rewards_rejected_mean"] == pytest.approx(0.0, abs=1e-6)
    assert set(metrics) == {
        "loss",
        "sft_loss",
        "preference_loss",
        "accuracy",
        "rewards_chosen_mean",
        "rewards_rejected_mean",
        "num_valid_samples",
    }


def test_dpo_rejects_odd_batches_and_split_pairs():
    logits, data = dpo_batch(seed=1)
    with pytest.raises(ValueError, match="batch size must be even, got 5"):
        call(DPOLossFn(), logits[:5], {k: v[:5] for k, v in data.items()})
    data["sample_mask"] = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="chosen row 0 and rejected row 1 differ"):
        call(DPOLossFn(), logits, data)


def test_preference_loss_hand_values():
    scores = torch.tensor([[2.0], [1.0], [0.0], [3.0], [9.0], [-9.0]], requires_grad=True)
    data = {"sample_mask": torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0])}
    loss, metrics = PreferenceLossFn()(scores, data, torch.tensor(4.0), None)
    expected = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(3.0))) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert metrics == {
        "loss": pytest.approx(expected, abs=1e-6),
        "accuracy": 0.5,
        "rewards_chosen_mean": 1.0,
        "rewards_rejected_mean": 2.0,
        "num_valid_samples": 2.0,
    }
    loss.backward()
    assert scores.grad[4:].abs().max() == 0
    with pytest.raises(ValueError, match=r"scores must be \[B, 1\] or \[B\]"):
        PreferenceLossFn()(torch.zeros(4, 2), data, torch.tensor(4.0), None)


def test_force_on_policy_ratio_equals_prev_logprobs_from_the_same_weights():
    """lp_prev := stop-grad(lp) gives the loss, metrics and gradients of passing the current logprobs as prev."""
    logits, data = random_batch(seed=5)
    on_policy = dict(data)
    on_policy["prev_logprobs"] = spec_layout(reference_logprobs(logits.detach(), data["input_ids"]).float())
    expected, expected_metrics = call(pg_loss(**ALL_BRANCHES), logits, on_policy)
    (expected_grad,) = torch.autograd.grad(expected, logits)
    forced = {k: v for k, v in data.items() if k != "prev_logprobs"}  # not needed any more
    loss, metrics = call(pg_loss(**ALL_BRANCHES, force_on_policy_ratio=True), logits, forced)
    (grad,) = torch.autograd.grad(loss, logits)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    assert torch.allclose(grad, expected_grad, atol=1e-6)
    assert metrics["probs_ratio"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["token_mult_prob_error"] == pytest.approx(expected_metrics["token_mult_prob_error"], abs=1e-5)


def test_async_grpo_loss_weights_each_token_by_trainer_over_engine_probability():
    """Async GRPO's loss (configs/grpo_smollm2_cpu_async.yaml): PPO ratio taken on-policy (r = 1) and each token's
    loss weighted by w = pi_trainer / pi_engine of its sampled token, truncated at 2, detached. By hand, with
    lp = -log 4 and engine logprobs lp - log w: L = -mean(A_t * min(w_t, 2)), dL/dlp_t = -A_t * min(w_t, 2) / 4."""
    engine_weights = [2.0, 0.5, 4.0, 1.0]  # the engine's (older) weights made tokens 0 and 2 less likely
    advantages = [[1.0, -1.0, 0.5, 2.0]]
    logits, data = uniform_batch(advantages, gen_shift=[[-math.log(w) for w in engine_weights]])
    del data["prev_logprobs"]  # not needed on-policy
    loss_fn = pg_loss(
        force_on_policy_ratio=True, use_importance_sampling_correction=True, truncated_importance_sampling_ratio=2.0
    )
    loss, metrics = call(loss_fn, logits, data)
    clipped = [min(w, 2.0) for w in engine_weights]
    expected = -sum(a * w for a, w in zip(advantages[0], clipped, strict=True)) / 4
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    # token_mult_prob_error reports how far apart the two policies are: the token mean of exp|log w|
    assert metrics["token_mult_prob_error"] == pytest.approx((2 + 2 + 4 + 1) / 4, rel=1e-6)
    loss.backward()
    # Through the uniform softmax: dlp_t/dlogit = onehot - 1/4 at the sampled token 0 of each position.
    grad_lp = torch.tensor([-a * w / 4 for a, w in zip(advantages[0], clipped, strict=True)])
    expected_grad = grad_lp[:, None] * (torch.nn.functional.one_hot(torch.zeros(4, dtype=torch.long), 4) - 0.25)
    torch.testing.assert_close(logits.grad[0, :4], expected_grad, atol=1e-6, rtol=0)
