"""Leaving samples without a gradient out of the training pass (`trained_rows`, `train_step.step_normalization`).

For every variant of `ClippedPGLossFn`, the gradient of a small model over a GRPO-like batch (groups without reward
variance have advantage 0; one sample is masked) is computed twice with the code path the workers run: over every
row with the whole batch's counts (what training did before), and over the rows `select_trained_rows` keeps with the
normalisation `step_normalization` gives. They must agree to 1e-6 (fp32; only the summation order differs).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nemo_rl_clone.algorithms.loss import ClippedPGLossFn
from nemo_rl_clone.algorithms.utils import reduce_train_results
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.distributed.model_utils import valid_counts
from nemo_rl_clone.models.policy.workers.train_step import scaled_loss, step_normalization
from nemo_rl_clone.models.policy.workers.trained_rows import select_trained_rows, trained_rows_for
from tests.unit.test_loss_functions import NEMO_RL_LOSS_CFG

VOCAB, HIDDEN, ROWS, WIDTH = 8, 4, 12, 7
# Groups of 4: rewards all equal in groups 0 and 2 (advantage 0), a spread in group 1; row 6 masked (e.g. overlong).
ADVANTAGES = [0.0] * 4 + [1.5, -0.5, 0.7, -1.5] + [0.0] * 4
MASKED_ROW = 6

VARIANTS = {
    "clip": {},
    "clip_higher_dual_clip": {"ratio_clip_max": 0.28, "ratio_clip_c": 3.0},
    "reinforce": {"disable_ppo_ratio": True},
    "cispo": {"use_cispo": True},
    "gspo": {"sequence_level_importance_ratios": True, "token_level_loss": False},
    "sequence_level_loss": {"token_level_loss": False},
    "tis": {"use_importance_sampling_correction": True, "truncated_importance_sampling_ratio": 1.1},
    "icepop": {
        "use_importance_sampling_correction": True,
        "truncated_importance_sampling_ratio": 1.1,
        "truncated_importance_sampling_type": "icepop",
        "truncated_importance_sampling_ratio_min": 0.9,
    },
    "seq_mask_tis": {
        "use_importance_sampling_correction": True,
        "truncated_importance_sampling_ratio": 1.2,
        "truncated_importance_sampling_type": "seq-mask-tis",
        "truncated_importance_sampling_ratio_min": 0.8,
    },
    "on_policy_ratio": {"force_on_policy_ratio": True},
}


def pg(**overrides: object) -> ClippedPGLossFn:
    return ClippedPGLossFn({**NEMO_RL_LOSS_CFG, "reference_policy_kl_penalty": 0.0, **overrides})


def make_batch(advantages: list[float] = ADVANTAGES, seed: int = 0) -> BatchedDataDict:
    """Rows of different lengths (right padding), prompt tokens masked, logprobs of the previous and the generating
    policy a little off each other so ratios, clips and importance weights all do something."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, WIDTH + 1, (ROWS,), generator=gen)
    positions = torch.arange(WIDTH)
    token_mask = ((positions >= 2) & (positions < lengths[:, None])).float()
    sample_mask = torch.ones(ROWS)
    sample_mask[MASKED_ROW] = 0.0
    prev = -torch.rand(ROWS, WIDTH, generator=gen) * 3 * token_mask
    return BatchedDataDict(
        input_ids=torch.randint(0, VOCAB, (ROWS, WIDTH), generator=gen),
        input_lengths=lengths,
        token_mask=token_mask,
        sample_mask=sample_mask,
        advantages=torch.tensor(advantages)[:, None].expand(ROWS, WIDTH).contiguous(),
        prev_logprobs=prev,
        generation_logprobs=prev + 0.2 * torch.randn(ROWS, WIDTH, generator=gen) * token_mask,
    )


class TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(1)
        self.embed = torch.nn.Parameter(torch.randn(VOCAB, HIDDEN, generator=gen))
        self.head = torch.nn.Parameter(torch.randn(HIDDEN, VOCAB, generator=gen))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed[input_ids] @ self.head


def train_every_row(loss_fn: ClippedPGLossFn, data: BatchedDataDict, gbs: int, mbs: int = 4) -> dict:
    """The training pass before this change: every row, the whole global batch's counts."""
    model, losses, metrics = TinyLM(), [], []
    for index in range(data.size // gbs):
        batch = data.get_batch(index, gbs)
        seqs, toks = valid_counts(batch)
        step = 0.0
        for microbatch in batch.make_microbatch_iterator(mbs):
            loss, mb_metrics = loss_fn(model(microbatch["input_ids"]), microbatch, seqs, toks)
            loss.backward()
            step += loss.item()
            metrics.append(mb_metrics)
        losses.append(step)
    return {"grads": [p.grad.clone() for p in model.parameters()], "losses": losses, "metrics": metrics}


def train_rows_with_gradient(loss_fn: ClippedPGLossFn, data: BatchedDataDict, gbs: int, dp: int, mbs: int = 2):
    """What `Policy.train` and a worker do now (the DP ranks' microbatches run here one after another: their
    all-reduced counts are the global batch's counts, their gradients sum)."""
    keep = loss_fn.rows_with_gradient(data)
    assert keep is not None
    trained = select_trained_rows(data, keep, gbs, dp)
    assert trained is not None
    model, losses, metrics = TinyLM(), [], []
    for index in range(trained.data.size // trained.global_batch_size):
        batch = trained.data.get_batch(index, trained.global_batch_size)
        norm = step_normalization(valid_counts(batch), trained.normalization[index], loss_fn.loss_type)
        step = 0.0
        for microbatch in batch.make_microbatch_iterator(mbs):
            loss, mb_metrics = loss_fn(model(microbatch["input_ids"]), microbatch, norm.valid_seqs, norm.valid_toks)
            loss, mb_metrics = scaled_loss(loss, mb_metrics, norm)
            loss.backward()
            step += loss.item()
            metrics.append(mb_metrics)
        losses.append(step)
    grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    return {"grads": grads, "losses": losses, "metrics": metrics, "trained": trained}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize(("gbs", "dp"), [(12, 1), (12, 2), (6, 2)])
def test_gradient_and_loss_unchanged_for_every_loss_variant(variant: str, gbs: int, dp: int) -> None:
    loss_fn, data = pg(**VARIANTS[variant]), make_batch()
    before = train_every_row(loss_fn, data, gbs)
    after = train_rows_with_gradient(loss_fn, data, gbs, dp)
    assert any(g.abs().max() > 1e-3 for g in before["grads"]), "the batch must carry a gradient"
    for expected, got in zip(before["grads"], after["grads"], strict=True):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    assert after["losses"] == pytest.approx(before["losses"], abs=1e-6)
    # 3 rows of group 1 carry a gradient (row 6 is masked); fewer rows run than before
    assert after["trained"].num_rows_with_gradient == 3
    assert after["trained"].data.size < data.size


def test_which_rows_run_and_what_the_top_up_rows_are() -> None:
    data = make_batch()
    trained = select_trained_rows(data, pg().rows_with_gradient(data), global_batch_size=12, dp_size=2)
    assert trained is not None
    # rows 4, 5, 7 carry a gradient; 3 rounds up to 4 for 2 ranks: the shortest unmasked other row tops it up
    others = [i for i in range(ROWS) if i not in (4, 5, 7, MASKED_ROW)]
    shortest = min(others, key=lambda i: (int(data["input_lengths"][i]), i))
    assert trained.data["input_ids"].tolist() == data["input_ids"][[4, 5, 7, shortest]].tolist()
    assert trained.data["sample_mask"].tolist() == [1.0, 1.0, 1.0, 1.0]
    assert trained.global_batch_size == 4 and trained.num_global_batches_with_metrics == 1
    seqs, toks = valid_counts(data)
    assert trained.normalization == [(float(seqs), float(toks))] and seqs == ROWS - 1


def test_metrics_describe_the_trained_rows() -> None:
    """The loss's metrics are means over the rows that ran (`loss` is the whole batch's): checked against the
    formula over rows 4, 5, 7 by hand."""
    loss_fn, data = pg(force_on_policy_ratio=True), make_batch()
    after = train_rows_with_gradient(loss_fn, data, gbs=12, dp=1)
    before = train_every_row(loss_fn, data, gbs=12)
    reduced = reduce_train_results(
        {
            "all_mb_metrics": {"token_mult_prob_error": [m["token_mult_prob_error"] for m in after["metrics"]]},
            "grad_norm": [0.0],
            "num_global_batches": 1,
            "num_global_batches_with_metrics": 1,
        },
        ["token_mult_prob_error"],
    )
    # force_on_policy_ratio: lp_prev is the trainer's own logprob
    model, rows = TinyLM(), [4, 5, 7]
    with torch.no_grad():
        logits = model(data["input_ids"][rows])
        lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, data["input_ids"][rows][:, 1:, None])[..., 0]
    mask = data["token_mask"][rows][:, 1:]
    gap = (data["generation_logprobs"][rows][:, 1:] - lp).abs().exp()
    assert reduced["token_mult_prob_error"] == pytest.approx(float((gap * mask).sum() / mask.sum()), abs=1e-6)
    assert sum(m["loss"] for m in after["metrics"]) == pytest.approx(sum(before["losses"]), abs=1e-6)


def test_a_batch_without_any_gradient_still_steps_with_zero_gradient() -> None:
    """Every group without reward variance: the shortest row per rank runs, the loss is 0 and every gradient exactly
    0 (not None), so the optimizer steps as it would have (Adam's moments decay); the metrics describe those rows."""
    loss_fn, data = pg(), make_batch(advantages=[0.0] * ROWS)
    after = train_rows_with_gradient(loss_fn, data, gbs=12, dp=2)
    trained = after["trained"]
    assert trained.data.size == 2 and trained.data["sample_mask"].tolist() == [1.0, 1.0]
    assert trained.num_rows_with_gradient == 0 and trained.num_global_batches_with_metrics == 1
    assert all(g.abs().max() == 0 for g in after["grads"])
    assert after["losses"] == [0.0]
    assert sum(m["num_valid_samples"] for m in after["metrics"]) == 2
    assert {"token_mult_prob_error", "approx_entropy"} <= {key for m in after["metrics"] for key in m}


def test_a_global_batch_of_masked_rows_reports_only_its_loss() -> None:
    """Two global batches, every row of the second masked (e.g. all overlong): it runs masked rows (loss 0, zero
    gradient) and reports only its loss, so the share metrics average over the first alone."""
    loss_fn, data = pg(), make_batch()
    data["sample_mask"] = torch.tensor([1.0] * 6 + [0.0] * 6)
    after = train_rows_with_gradient(loss_fn, data, gbs=6, dp=1)
    assert after["trained"].num_global_batches_with_metrics == 1
    assert {key for m in after["metrics"][-1:] for key in m} == {"loss"}
    mb = {key: [m[key] for m in after["metrics"] if key in m] for key in ("loss", "probs_ratio")}
    results = {
        "all_mb_metrics": mb,
        "grad_norm": [0.0, 0.0],
        "num_global_batches": 2,
        "num_global_batches_with_metrics": 1,
    }
    reduced = reduce_train_results(results, ["loss", "probs_ratio"])
    assert reduced["probs_ratio"] == pytest.approx(sum(mb["probs_ratio"]), abs=1e-7)
    assert reduced["loss"] == pytest.approx(sum(mb["loss"]) / 2, abs=1e-7)


def test_every_row_trains_with_a_kl_term_or_when_switched_off() -> None:
    data = make_batch()
    assert pg(reference_policy_kl_penalty=0.01).rows_with_gradient(data) is None
    assert pg(train_only_samples_with_gradient=False).rows_with_gradient(data) is None
    # nothing to leave out: every row has a gradient
    everything = make_batch(advantages=[float(i % 3 + 1) for i in range(ROWS)])
    everything["sample_mask"] = torch.ones(ROWS)
    keep = pg().rows_with_gradient(everything)
    assert keep is not None and bool(keep.all())
    assert select_trained_rows(everything, keep, global_batch_size=12, dp_size=2) is None


def test_a_router_load_balancing_loss_trains_every_row() -> None:
    """It depends on every row that runs, whatever the advantage; with one, nothing is left out, even in a batch
    without any gradient of the policy loss (a real policy on each backend: test_moe.py, test_megatron_moe.py)."""
    for advantages in (ADVANTAGES, [0.0] * ROWS):
        data = make_batch(advantages)
        assert trained_rows_for(pg(), data, 12, 2, router_aux_loss=False) is not None
        assert trained_rows_for(pg(), data, 12, 2, router_aux_loss=True) is None


# ------------------------------------------------------------------ the MoE policies' router-loss checks
def grpo_rows(data: BatchedDataDict, advantages: list[float]) -> BatchedDataDict:
    """``data`` (rows of a policy test) as a GRPO batch: per-row ``advantages``, on-policy logprobs (the loss below
    forces the ratio to 1, so they are never read)."""
    rows, width = data["input_ids"].shape
    return BatchedDataDict(
        {
            **data,
            "advantages": torch.tensor(advantages)[:, None].expand(rows, width).contiguous(),
            "prev_logprobs": torch.zeros(rows, width),
            "generation_logprobs": torch.zeros(rows, width),
        }
    )


def router_loss_plans(cfg: Any, dp: int, data: BatchedDataDict, has_router_aux_loss: bool) -> dict[str, Any]:
    """`TrainPlan`s of one GRPO step: ``policy`` as `Policy.train` makes it for a policy whose workers answer
    ``has_router_aux_loss``; ``every_row`` with skipping switched off; ``skipping`` with the rows left out regardless
    (what a policy with a router loss did before it told `Policy.train`)."""
    from nemo_rl_clone.models.policy.lm_policy import TrainPlan

    gbs, mbs = cfg.train_global_batch_size, cfg.train_micro_batch_size
    loss_fn = pg(force_on_policy_ratio=True)
    every_row = pg(force_on_policy_ratio=True, train_only_samples_with_gradient=False)
    return {
        "policy": TrainPlan.make(cfg, dp, data, loss_fn, gbs, mbs, router_aux_loss=has_router_aux_loss),
        "every_row": TrainPlan.make(cfg, dp, data, every_row, gbs, mbs, router_aux_loss=has_router_aux_loss),
        "skipping": TrainPlan.make(cfg, dp, data, loss_fn, gbs, mbs, router_aux_loss=False),
    }
