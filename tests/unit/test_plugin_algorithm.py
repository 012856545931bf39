"""An algorithm added from outside the package: its own module, one `register_algorithm` call and an entry point's
`run_algorithm_cli` — no file of `nemo_rl_clone` edited. The skeleton then gives it what every algorithm gets: the
config validated once (one line per problem, exit 2), pre-flight, the dry run, the shared loop's schedule, logging
and clean shutdown.

The plug-in is a real if tiny learner: REINFORCE with a running-mean baseline on a 3-armed bandit (softmax policy
over the arms, rewards fixed per arm). Its expected reward under the policy is computed exactly (no sampling), so
the test can say it learned: from 1/3 · Σ rewards at the start to near the best arm's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from nemo_rl_clone.algorithms import registry
from nemo_rl_clone.algorithms.interfaces import Algorithm
from nemo_rl_clone.algorithms.run.cli import run_algorithm_cli
from nemo_rl_clone.algorithms.run.loop import Schedule, StepResult, train_loop
from nemo_rl_clone.algorithms.run.state import RunState
from nemo_rl_clone.distributed.virtual_cluster import ClusterConfig
from nemo_rl_clone.utils.checkpoint import CheckpointingConfig, CheckpointManager
from nemo_rl_clone.utils.logger import Logger, LoggerConfig
from nemo_rl_clone.utils.timer import Timer


@dataclass
class BanditConfig:
    max_num_steps: int = 30
    max_num_epochs: int = 1
    val_period: int = 10
    val_at_start: bool = True
    val_at_end: bool = False
    arm_rewards: list[float] = field(default_factory=lambda: [0.1, 0.9, 0.3])
    samples_per_step: int = 64
    lr: float = 0.5
    seed: int = 0

    def check(self) -> list[tuple[str, str]]:
        return [("lr", f"must be > 0, got {self.lr}")] if self.lr <= 0 else []


@dataclass
class BanditMasterConfig:
    bandit: BanditConfig = field(default_factory=BanditConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    checkpointing: CheckpointingConfig = field(
        default_factory=lambda: CheckpointingConfig(enabled=False, metric_name=None)
    )
    cluster: ClusterConfig = field(default_factory=ClusterConfig)


class _Draws:
    """The loop's data position: every step draws fresh samples, one epoch never ends."""

    completed_epochs = 0

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@dataclass
class BanditRun:
    config: BanditMasterConfig
    logits: torch.Tensor
    logger: Logger
    log_dir: Path
    closed: bool = False

    def shutdown(self) -> None:
        self.closed = True
        _RUNS.append(self)


_RUNS: list[BanditRun] = []


def expected_reward(logits: torch.Tensor, rewards: torch.Tensor) -> float:
    return float((torch.softmax(logits, 0) * rewards).sum())


class BanditSteps:
    def __init__(self, run: BanditRun) -> None:
        cfg = run.config
        self.run, self.state, self.logger, self.log_dir = run, RunState(), run.logger, run.log_dir
        self.checkpointing = cfg.checkpointing
        self.checkpointer = CheckpointManager(cfg.checkpointing)
        self.schedule = Schedule.for_rollouts("Bandit", cfg.bandit)
        self.rewards = torch.tensor(cfg.bandit.arm_rewards)
        self.generator = torch.Generator().manual_seed(cfg.bandit.seed)
        self.baseline = 0.0
        self.position = _Draws()

    def start(self, timer: Timer) -> None:
        pass

    def train_step(self, step: int, timer: Timer) -> StepResult | None:
        cfg, logits = self.run.config.bandit, self.run.logits
        probs = torch.softmax(logits, 0)
        arms = torch.multinomial(probs, cfg.samples_per_step, replacement=True, generator=self.generator)
        reward = self.rewards[arms]
        # REINFORCE: ∇ log π(a) = onehot(a) − π, weighted by the reward above the running baseline
        advantage = reward - self.baseline
        grad = (advantage[:, None] * (torch.nn.functional.one_hot(arms, len(probs)) - probs)).mean(0)
        logits += cfg.lr * grad
        self.baseline = 0.9 * self.baseline + 0.1 * float(reward.mean())
        return StepResult({"reward": float(reward.mean()), "baseline": self.baseline}, valid_samples=len(arms))

    def sync_weights(self, step: int, timer: Timer) -> None:
        pass

    def validate(self, step: int, timer: Timer) -> None:
        value = expected_reward(self.run.logits, self.rewards)
        self.logger.log_metrics({"expected_reward": value}, step, prefix="validation")

    def after_step(self, step: int, result: StepResult) -> None:
        pass

    def save(self) -> Path | None:
        return None

    def log_step(self, step: int, result: StepResult, timing: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


class Bandit(Algorithm):
    name = "bandit"
    config_class = BanditMasterConfig

    def setup(self, config: BanditMasterConfig) -> BanditRun:
        log_dir = Path(config.logger.log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        logits = torch.zeros(len(config.bandit.arm_rewards))
        return BanditRun(config, logits, Logger(config.logger, log_dir), log_dir)

    def train(self, run: BanditRun) -> None:
        train_loop(BanditSteps(run))

    def datasets(self, config: BanditMasterConfig, tokenizer: Any) -> tuple[Any, Any, int | None]:
        return None, None, None


ALGORITHM = Bandit()


@pytest.fixture
def bandit(tmp_path):
    registry.register_algorithm("bandit", f"{__name__}:BanditMasterConfig", f"{__name__}:ALGORITHM", "Bandit")
    config = tmp_path / "bandit.yaml"
    config.write_text(
        f"bandit:\n  max_num_steps: 5\n  val_period: 5\n  lr: 0.5\n  arm_rewards: [0.1, 0.9, 0.3]\n"
        f"logger:\n  log_dir: {tmp_path / 'logs'}\n"
    )
    _RUNS.clear()
    yield config
    registry.unregister_algorithm("bandit")


def test_a_plug_in_algorithm_trains_through_the_shared_entry_point_and_loop(bandit, tmp_path):
    run_algorithm_cli("bandit", bandit, ["bandit.max_num_steps=30", "bandit.val_period=10"])

    (run,) = _RUNS
    assert run.closed, "run_training shuts the run down"
    logged = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    validation = {
        row["step"]: row["validation/expected_reward"] for row in logged if "validation/expected_reward" in row
    }
    # val_at_start, every val_period: the loop's schedule, not the plug-in's
    assert sorted(validation) == [0, 10, 20, 30]
    assert validation[0] == pytest.approx((0.1 + 0.9 + 0.3) / 3, abs=1e-6)  # uniform policy, exact
    assert validation[30] > 0.8, validation  # near the best arm (0.9): it learned
    assert [row["step"] for row in logged if "train/reward" in row] == list(range(1, 31))
    baselines = [row["train/baseline"] for row in logged if "train/reward" in row]
    assert len(baselines) == 30 and all(math.isfinite(b) for b in baselines) and baselines[-1] > baselines[0]


def test_a_plug_in_config_is_validated_once_before_anything_starts(bandit, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_algorithm_cli("bandit", bandit, ["bandit.lr=-1", "+bandit.typo=3"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "bandit.lr: must be > 0, got -1" in err and "bandit.typo" in err
    assert not _RUNS, "nothing started"


def test_a_plug_in_dry_run_checks_and_plans_without_a_language_model(bandit, capsys):
    run_algorithm_cli("bandit", bandit, ["--dry-run"])
    assert not _RUNS, "a dry run builds nothing"
