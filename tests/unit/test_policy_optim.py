"""Optimizer / scheduler construction from the policy config (no workers)."""

from __future__ import annotations

import pytest
import torch

from nemo_rl_clone.models.policy.config import OptimizerConfig, PolicyConfig
from nemo_rl_clone.models.policy.workers.optim import (
    build_optimizer,
    build_scheduler,
    check_import_paths,
    import_by_path,
)


def _params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.ones(3))]


def test_import_by_path_suggests_the_nearest_class() -> None:
    with pytest.raises(ValueError) as error:
        import_by_path("torch.optim.AdamWW", "policy.optimizer.name")
    assert str(error.value) == (
        "policy.optimizer.name: cannot import 'torch.optim.AdamWW' (did you mean torch.optim.AdamW?)"
    )


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("AdamW", "is not a dotted class path"),
        ("torch.optimz.AdamW", "cannot import 'torch.optimz.AdamW' (module 'torch.optimz'"),
    ],
)
def test_import_by_path_rejects_bad_paths(path: str, expected: str) -> None:
    with pytest.raises(ValueError, match=r"policy\.optimizer\.name: ") as error:
        import_by_path(path, "policy.optimizer.name")
    assert expected in str(error.value)


def test_check_import_paths_names_the_scheduler_entry() -> None:
    scheduler = [
        {"name": "torch.optim.lr_scheduler.LinearLR", "kwargs": {}},
        {"name": "torch.optim.lr_scheduler.ConstantLRR", "kwargs": {}},
        {"milestones": [5]},
    ]
    with pytest.raises(
        ValueError, match=r"policy\.scheduler\[1\]\.name: .*did you mean torch\.optim\.lr_scheduler\.ConstantLR\?"
    ):
        check_import_paths(OptimizerConfig(), scheduler)


def test_build_optimizer_turns_yaml_lists_into_tuples() -> None:
    config = OptimizerConfig(name="torch.optim.AdamW", kwargs={"lr": 0.1, "betas": [0.8, 0.9], "eps": 1e-6})
    optimizer = build_optimizer(_params(), config)
    assert isinstance(optimizer, torch.optim.AdamW)
    group = optimizer.param_groups[0]
    assert (group["lr"], group["betas"], group["eps"]) == (0.1, (0.8, 0.9), 1e-6)


def test_build_optimizer_rejects_unknown_kwargs() -> None:
    config = OptimizerConfig(name="torch.optim.SGD", kwargs={"lr": 0.1, "betaz": 1})
    with pytest.raises(ValueError, match=r"policy\.optimizer\.kwargs: torch\.optim\.SGD rejected .*betaz"):
        build_optimizer(_params(), config)


def test_default_scheduler_warms_up_linearly_then_stays_constant() -> None:
    """NeMo-RL's default: LinearLR(0.1 → 1.0 over 50 steps), then ConstantLR from milestone 50."""
    base_lr = 2.0
    optimizer = torch.optim.SGD(_params(), lr=base_lr)
    scheduler = build_scheduler(optimizer, PolicyConfig().scheduler)
    lrs = []
    for _ in range(60):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    expected = [base_lr * (0.1 + 0.9 * min(step, 50) / 50) for step in range(60)]
    assert lrs == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("entries", [None, []])
def test_no_scheduler_means_constant_lr(entries: list | None) -> None:
    optimizer = torch.optim.SGD(_params(), lr=0.5)
    scheduler = build_scheduler(optimizer, entries)
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 0.5


def test_chained_schedulers_need_matching_milestones() -> None:
    entries = [
        {"name": "torch.optim.lr_scheduler.LinearLR", "kwargs": {"total_iters": 2}},
        {"name": "torch.optim.lr_scheduler.ConstantLR", "kwargs": {}},
    ]
    optimizer = torch.optim.SGD(_params(), lr=0.5)
    with pytest.raises(ValueError, match=r"2 schedulers need one \{milestones: \[\.\.\.\]\} entry with 1 values"):
        build_scheduler(optimizer, entries)


def test_scheduler_kwargs_error_names_the_entry() -> None:
    entries = [{"name": "torch.optim.lr_scheduler.LinearLR", "kwargs": {"start": 0.1}}]
    optimizer = torch.optim.SGD(_params(), lr=0.5)
    with pytest.raises(
        ValueError, match=r"policy\.scheduler\[0\]\.kwargs: torch\.optim\.lr_scheduler\.LinearLR rejected"
    ):
        build_scheduler(optimizer, entries)
