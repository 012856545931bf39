"""The watchdog's bounds and its warning; a stopped Ray actor outside the worker groups named by its pid and stack
(the run's stop on a stalled engine: tests/functional/test_watchdog.py)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import ray

from nemo_rl_clone.utils import watchdog
from nemo_rl_clone.utils.watchdog import Watchdog, WatchdogConfig


def test_bounds_follow_each_phases_own_median_above_the_minimums(tmp_path: Path) -> None:
    dog = Watchdog(WatchdogConfig(warn_factor=3, warn_min_s=5, stop_factor=10, stop_min_s=20), tmp_path, str)
    assert dog.bounds("generation") == (5, 20)  # never seen: the minimums
    dog.durations["generation"] = [1.0, 4.0, 100.0]  # median 4: 3 x 4 = 12 s, 10 x 4 = 40 s
    dog.durations["training"] = [0.5, 0.5]
    assert dog.bounds("generation") == (12, 40) and dog.bounds("training") == (5, 20)


def test_a_phase_past_its_warn_bound_is_named_once_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    dog = Watchdog(WatchdogConfig(warn_min_s=0.05, stop_min_s=60), tmp_path, str)
    dog.start_phase(1, "generation")
    dog.end_phase()  # phase durations are recorded as phases end
    assert len(dog.durations["generation"]) == 1
    dog.start_phase(2, "generation")
    dog.check()
    assert capsys.readouterr().err == ""  # within the bound
    time.sleep(0.1)
    dog.check()
    dog.check()
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("watchdog: step 2 generation has run 0 s (warns after 0 s, stops the run after 60 s): ")
    assert line.endswith("no worker call pending (the driver itself)")


def test_watchdog_config_refuses_bounds_out_of_order() -> None:
    assert WatchdogConfig().check() == []
    assert WatchdogConfig(warn_min_s=0).check() == [("warn_min_s", "must be > 0, got 0")]
    assert WatchdogConfig(warn_min_s=100, stop_min_s=50).check() == [
        ("stop_min_s", "must be >= warn_min_s (100), got 50")
    ]


@ray.remote(num_cpus=0)
class Scorer:  # stands for an environment or agent actor: named by its class, as an unnamed actor is
    def pid(self) -> int:
        return os.getpid()

    def step(self) -> str:
        return "done"


def test_a_stopped_environment_actor_is_named_with_its_pid_and_stack(
    ray_local: None, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    cfg = WatchdogConfig(warn_min_s=0.05, stop_min_s=60, poll_s=3600)  # checked by hand below
    actor = Scorer.remote()
    pid = ray.get(actor.pid.remote())
    os.kill(pid, signal.SIGSTOP)
    try:
        with watchdog.watching(cfg, tmp_path, str) as dog:
            assert dog is not None
            ref = actor.step.remote()
            watchdog.track_actor(ref, actor, "step")  # as the rollout does for every environment step
            dog.start_phase(1, "generation")
            time.sleep(0.1)
            dog.check()
    finally:
        os.kill(pid, signal.SIGCONT)
    assert ray.get(ref, timeout=60) == "done"
    (line,) = capsys.readouterr().err.splitlines()
    stack = tmp_path / "watchdog" / "step_1_Scorer.txt"
    assert line.endswith(f"waiting on Scorer (pid {pid}) step for 0 s (stack: {stack})"), line
    assert f"Process {pid}" in stack.read_text()  # py-spy's dump of that process
    ray.kill(actor)
