"""The shared training loop (`algorithms.run.loop.train_loop`) and the algorithm registry.

The loop is driven by a scripted algorithm that records every call, with a real `Logger` and `CheckpointManager`
on a temporary directory: the order of train → sync → validate → log → save, the validation and save schedules,
the end of the data and the saved deadline are the loop's, whatever the algorithm.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from nemo_rl_clone.algorithms import registry
from nemo_rl_clone.algorithms.interfaces import Algorithm
from nemo_rl_clone.algorithms.run.loop import Schedule, StepResult, train_loop
from nemo_rl_clone.algorithms.run.state import RunState
from nemo_rl_clone.utils.checkpoint import CheckpointingConfig, CheckpointManager
from nemo_rl_clone.utils.logger import Logger, LoggerConfig
from nemo_rl_clone.utils.timer import Timer

REPO = Path(__file__).resolve().parents[2]


class _Position:
    def __init__(self, steps_per_epoch: int) -> None:
        self.drawn, self.steps_per_epoch = 0, steps_per_epoch

    @property
    def completed_epochs(self) -> int:
        return self.drawn // self.steps_per_epoch

    def state_dict(self) -> dict[str, Any]:
        return {"drawn": self.drawn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.drawn = state["drawn"]


class ScriptedSteps:
    """A `StepAlgorithm` whose step trains nothing: it records the calls the loop makes, in order."""

    def __init__(self, tmp: Path, schedule: Schedule, steps_per_epoch: int = 100, data_steps: int = 100, **ckpt):
        self.schedule, self.calls = schedule, []
        self.state, self.log_dir = RunState(), tmp / "logs"
        self.logger = Logger(LoggerConfig(log_dir=str(self.log_dir)), self.log_dir)
        self.checkpointing = CheckpointingConfig(checkpoint_dir=str(tmp / "ckpt"), metric_name=None, **ckpt)
        self.checkpointer = CheckpointManager(self.checkpointing)
        self._position, self.data_steps = _Position(steps_per_epoch), data_steps

    @property
    def position(self) -> _Position:
        return self._position

    def start(self, timer: Timer) -> None:
        self.calls.append("start")

    def train_step(self, step: int, timer: Timer) -> StepResult | None:
        if step > self.data_steps:
            self.calls.append(f"no data {step}")
            return None
        self._position.drawn += 1
        self.calls.append(f"train {step}")
        return StepResult({"loss": float(step), "reward": 0.5, "other": 1.0}, valid_samples=4, kept=("loss",))

    def sync_weights(self, step: int, timer: Timer) -> None:
        assert self.state.step == step, "a step is complete (and counted) before the engines get its weights"
        self.calls.append(f"sync {step}")

    def validate(self, step: int, timer: Timer) -> None:
        self.calls.append(f"validate {step}")

    def after_step(self, step: int, result: StepResult) -> None:
        self.calls.append(f"after {step}")

    def save(self) -> Path | None:
        logged = [json.loads(line)["step"] for line in (self.log_dir / "metrics.jsonl").read_text().splitlines()]
        assert logged[-1] == self.state.step, "a step's metrics are logged before its save"
        self.calls.append(f"save {self.state.step}")
        return None

    def log_step(self, step: int, result: StepResult, timing: dict[str, float]) -> None:
        assert "total_step_time" in timing
        self.calls.append(f"log {step}")

    def close(self) -> None:
        self.calls.append("close")


def _schedule(**overrides: Any) -> Schedule:
    values: dict[str, Any] = {"title": "T", "max_num_steps": 4, "max_num_epochs": 10, "val_period": 2}
    values |= {"val_at_start": True, "val_at_end": False}
    values.update(overrides)
    return Schedule(**values)


def test_the_loop_runs_each_step_in_order_and_validates_and_saves_on_schedule(tmp_path):
    steps = ScriptedSteps(tmp_path, _schedule(), save_period=3)
    train_loop(steps)
    assert steps.calls == [
        "start", "validate 0",
        "train 1", "sync 1", "after 1", "log 1",
        "train 2", "sync 2", "validate 2", "after 2", "log 2",
        "train 3", "sync 3", "after 3", "save 3", "log 3",
        "train 4", "sync 4", "validate 4", "after 4", "save 4", "log 4",  # the last step is always saved
        "close",
    ]  # fmt: skip
    assert steps.state.step == 4 and steps.state.total_valid_samples == 16
    assert steps.state.train_metrics == {"loss": 4.0}  # only the kept metrics rank checkpoints


def test_val_at_end_validates_the_last_step_before_its_save_once(tmp_path):
    steps = ScriptedSteps(tmp_path, _schedule(max_num_steps=3, val_at_start=False, val_at_end=True), save_period=99)
    train_loop(steps)
    assert [c for c in steps.calls if c.startswith(("validate", "save"))] == ["validate 2", "validate 3", "save 3"]
    steps = ScriptedSteps(tmp_path / "b", _schedule(max_num_steps=4, val_at_start=False, val_at_end=True))
    train_loop(steps)  # the periodic validation of the last step is not repeated
    assert [c for c in steps.calls if c.startswith("validate")] == ["validate 2", "validate 4"]


def test_the_epoch_limit_and_the_end_of_the_data_stop_the_loop(tmp_path):
    steps = ScriptedSteps(tmp_path, _schedule(max_num_steps=10, max_num_epochs=1, val_period=0), steps_per_epoch=2)
    train_loop(steps)
    assert [c for c in steps.calls if c.startswith(("train", "save"))] == ["train 1", "train 2", "save 2"]
    steps = ScriptedSteps(tmp_path / "b", _schedule(max_num_steps=10, val_period=0), data_steps=1)
    train_loop(steps)
    assert steps.calls[-3:] == ["log 1", "no data 2", "close"] and steps.state.step == 1


def test_a_reached_deadline_saves_and_stops(tmp_path):
    steps = ScriptedSteps(
        tmp_path, _schedule(max_num_steps=10, val_period=0, val_at_start=False), checkpoint_must_save_by="00:00:00:00"
    )
    train_loop(steps)
    assert steps.calls == ["start", "train 1", "sync 1", "after 1", "save 1", "log 1", "close"]


def test_a_resumed_run_does_not_validate_at_start(tmp_path):
    steps = ScriptedSteps(tmp_path, _schedule())
    steps.state.step = 3
    train_loop(steps)
    assert steps.calls[:2] == ["start", "train 4"]


@pytest.mark.parametrize("name", registry.algorithm_names())
def test_every_registered_algorithm_loads_and_owns_its_config(name):
    algorithm = registry.get_algorithm(name)
    assert isinstance(algorithm, Algorithm) and algorithm.name == name
    assert registry.config_class(name) is algorithm.config_class
    assert registry.algorithm_for(algorithm.config_class()) is algorithm


def test_registry_names_the_known_algorithms_and_plug_ins_register_by_path():
    assert {"grpo", "distillation", "sft", "dpo", "rm"} <= set(registry.algorithm_names())
    with pytest.raises(KeyError, match="no algorithm 'nope'; registered: distillation, dpo, grpo"):
        registry.get_algorithm("nope")
    registry.register_algorithm(
        "sft_alias", "nemo_rl_clone.algorithms.sft:SFTMasterConfig", "nemo_rl_clone.algorithms.sft:ALGORITHM"
    )
    try:
        assert registry.get_algorithm("sft_alias") is registry.get_algorithm("sft")
    finally:
        registry.unregister_algorithm("sft_alias")


def test_the_dry_run_and_pre_flight_ask_the_algorithm_not_the_config_sections():
    """Telling algorithms apart by ``hasattr(config, "grpo")`` is what the registry replaced."""
    for module in ("dry_run.py", "preflight.py", "cli.py"):
        tree = ast.parse((REPO / "nemo_rl_clone" / "algorithms" / "run" / module).read_text())
        probes = [
            node.args[1].value
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and getattr(node.func, "id", None) in ("hasattr", "getattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
        ]
        assert not {"grpo", "sft", "dpo", "rm", "teacher", "distillation"} & set(probes), (module, probes)
