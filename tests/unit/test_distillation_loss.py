"""`DistillationLossFn` against an independent float64 reference built from explicit distributions.

The reference writes out each distribution over the whole vocabulary and applies the KL definitions directly:
the teacher's renormalised top-k distribution q (with ``zero_outside_topk``: log q = −100 outside the top-k), the
student's distribution p (renormalised over the top-k, or its full softmax with ``zero_outside_topk``). The loss runs
in float32; tolerance 1e-5 relative / 1e-6 absolute.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from nemo_rl_clone.algorithms.loss.distillation import DistillationLossConfig, DistillationLossFn
from nemo_rl_clone.contract.sampling import TrainingSamplingParams
from nemo_rl_clone.distributed.model_utils import valid_counts

B, S, V, K = 3, 6, 11, 4
TOL = {"rtol": 1e-5, "atol": 1e-6}


def _batch(seed: int = 0, k: int = K) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    student_logits = torch.randn(B, S, V, generator=gen) * 2
    teacher_logits = torch.randn(B, S, V, generator=gen) * 2
    topk = teacher_logits.topk(k, dim=-1)
    token_mask = torch.ones(B, S)
    token_mask[:, :2] = 0  # prompt
    token_mask[1, 4:] = 0  # padding
    data = {
        "input_ids": torch.randint(0, V, (B, S), generator=gen),
        "token_mask": token_mask,
        "sample_mask": torch.tensor([1.0, 1.0, 0.0]),
        "teacher_topk_logits": topk.values,
        "teacher_topk_indices": topk.indices,
    }
    return student_logits, data


def _reference_per_token(
    student_logits: torch.Tensor, data: dict[str, torch.Tensor], kl_type: str, w: float, zero_outside: bool
) -> torch.Tensor:
    """[B, S-1] per-position KL in float64, one position at a time over explicit vocab-sized vectors."""
    out = torch.zeros(B, S - 1, dtype=torch.float64)
    for b in range(B):
        for t in range(S - 1):
            ids = data["teacher_topk_indices"][b, t]
            logits = student_logits[b, t].double()
            log_q_top = F.log_softmax(data["teacher_topk_logits"][b, t].double(), dim=0)
            if zero_outside:
                log_p = F.log_softmax(logits, dim=0)  # full vocabulary
                log_q = torch.full((V,), -100.0, dtype=torch.float64)
                log_q[ids] = log_q_top
                support = torch.arange(V)
            else:
                log_p = torch.full((V,), float("-inf"), dtype=torch.float64)
                log_p[ids] = F.log_softmax(logits[ids], dim=0)
                log_q = torch.full((V,), float("-inf"), dtype=torch.float64)
                log_q[ids] = log_q_top
                support = ids
            forward = sum(math.exp(log_q[v]) * (log_q[v] - log_p[v]) for v in ids.tolist())
            reverse = sum(math.exp(log_p[v]) * (log_p[v] - log_q[v]) for v in support.tolist())
            out[b, t] = {"forward": forward, "reverse": reverse, "mixed": w * forward + (1 - w) * reverse}[kl_type]
    return out


@pytest.mark.parametrize("zero_outside", [False, True])
@pytest.mark.parametrize("kl_type,w", [("forward", 0.5), ("reverse", 0.5), ("mixed", 0.3)])
def test_kl_matches_reference(kl_type: str, w: float, zero_outside: bool) -> None:
    logits, data = _batch()
    cfg = {"kl_type": kl_type, "mixed_kl_weight": w, "zero_outside_topk": zero_outside}
    valid_seqs, valid_toks = valid_counts(data)
    loss, metrics = DistillationLossFn(cfg)(logits, data, valid_seqs, valid_toks)
    per_token = _reference_per_token(logits, data, kl_type, w, zero_outside)
    mask = data["token_mask"][:, 1:].double() * data["sample_mask"].double()[:, None]
    expected = (per_token * mask).sum() / mask.sum()
    torch.testing.assert_close(loss.double(), expected, **TOL)
    assert metrics["loss"] == pytest.approx(expected.item(), rel=1e-5)
    assert metrics["num_valid_samples"] == 2 and metrics["num_unmasked_tokens"] == mask.sum().item()
    for name in ("forward", "reverse"):
        ref = (_reference_per_token(logits, data, name, w, zero_outside) * mask).sum() / mask.sum()
        assert metrics[f"kl_{name}"] == pytest.approx(ref.item(), rel=1e-5)


def test_full_vocab_topk_is_the_exact_kl() -> None:
    """With k = V the top-k is the whole distribution: both directions equal torch's kl_div, with or without
    zero_outside_topk (no mass lies outside)."""
    logits, data = _batch(seed=1, k=V)
    mask = data["token_mask"][:, 1:] * data["sample_mask"][:, None]
    log_p = F.log_softmax(logits[:, :-1].double(), dim=-1)
    teacher_full = torch.empty(B, S, V).scatter_(-1, data["teacher_topk_indices"], data["teacher_topk_logits"])
    log_q = F.log_softmax(teacher_full[:, :-1].double(), dim=-1)
    exact = {
        "forward": F.kl_div(log_p, log_q, log_target=True, reduction="none").sum(-1),
        "reverse": F.kl_div(log_q, log_p, log_target=True, reduction="none").sum(-1),
    }
    for zero_outside in (False, True):
        for kl_type, per_token in exact.items():
            fn = DistillationLossFn({"kl_type": kl_type, "zero_outside_topk": zero_outside})
            loss, _ = fn(logits, data, torch.tensor(2.0), mask.sum())
            torch.testing.assert_close(loss.double(), (per_token * mask).sum() / mask.sum(), **TOL)


def test_microbatch_shares_sum_to_the_global_mean() -> None:
    logits, data = _batch(seed=2)
    fn = DistillationLossFn({"kl_type": "reverse", "zero_outside_topk": True})
    valid_seqs, valid_toks = valid_counts(data)
    whole, _ = fn(logits, data, valid_seqs, valid_toks)
    parts = [
        fn(logits[i : i + 1], {k: v[i : i + 1] for k, v in data.items()}, valid_seqs, valid_toks)[0] for i in range(B)
    ]
    torch.testing.assert_close(sum(parts), whole, **TOL)


def test_gradient_moves_the_student_towards_the_teacher() -> None:
    """A few plain gradient steps on the logits lower every variant's loss (the loss is differentiable and its
    gradient points the right way)."""
    _, data = _batch(seed=3)
    valid_seqs, valid_toks = valid_counts(data)
    for kl_type in ("forward", "reverse", "mixed"):
        for zero_outside in (False, True):
            fn = DistillationLossFn({"kl_type": kl_type, "zero_outside_topk": zero_outside})
            logits = _batch(seed=3)[0].requires_grad_(True)
            first, _ = fn(logits, data, valid_seqs, valid_toks)
            for _ in range(50):
                loss, _ = fn(logits, data, valid_seqs, valid_toks)
                (grad,) = torch.autograd.grad(loss, logits)
                logits = (logits - 20.0 * grad).detach().requires_grad_(True)
            last, _ = fn(logits, data, valid_seqs, valid_toks)
            assert last < 0.5 * first, (kl_type, zero_outside, first.item(), last.item())


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match="kl_type"):
        DistillationLossFn({"kl_type": "jensen"})
    with pytest.raises(ValueError, match=r"mixed_kl_weight: must be in \[0, 1\]"):
        DistillationLossFn({"kl_type": "mixed", "mixed_kl_weight": 1.5})
    with pytest.raises(ValueError, match="zero_outside_top_k"):
        DistillationLossFn({"zero_outside_top_k": True})
    with pytest.raises(ValueError, match="mixed_kl_weight"):
        DistillationLossFn({"mixed_kl_weight": -0.1})
    typed = DistillationLossConfig(kl_type="reverse")  # validated where the config was loaded: used as is
    assert DistillationLossFn(typed).cfg is typed
    fn = DistillationLossFn()  # NeMo-RL's recipe defaults
    assert (fn.kl_type, fn.mixed_kl_weight, fn.zero_outside_topk) == ("forward", 0.5, False)


def test_missing_teacher_topk_is_one_clear_error() -> None:
    logits, data = _batch()
    del data["teacher_topk_indices"]
    with pytest.raises(KeyError, match="teacher_topk_indices"):
        DistillationLossFn()(logits, data, torch.tensor(2.0), torch.tensor(5.0))


def test_student_logits_are_divided_by_its_sampling_temperature() -> None:
    """At the student's sampling temperature 0.5 the loss is the hand reference on logits / 0.5 (its top-k/top-p
    play no part: the KL compares whole distributions), and differs from the one at temperature 1."""
    logits, data = _batch()
    valid_seqs, valid_toks = valid_counts(data)
    sampling = TrainingSamplingParams(temperature=0.5, top_k=3, top_p=0.9)
    loss, _ = DistillationLossFn({"kl_type": "forward"}, sampling)(logits, data, valid_seqs, valid_toks)
    mask = data["token_mask"][:, 1:].double() * data["sample_mask"].double()[:, None]
    per_token = _reference_per_token(logits / 0.5, data, "forward", 0.5, False)
    torch.testing.assert_close(loss.double(), (per_token * mask).sum() / mask.sum(), **TOL)
    unscaled, _ = DistillationLossFn({"kl_type": "forward"})(logits, data, valid_seqs, valid_toks)
    assert abs(unscaled.item() - loss.item()) > 1e-3
