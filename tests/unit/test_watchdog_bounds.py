"""The watchdog's bounds and its warning, without Ray (the stop and a real stalled worker: functional test)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

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
    assert line.endswith("no worker call pending (the driver itself, or an actor outside the worker groups)")


def test_watchdog_config_refuses_bounds_out_of_order() -> None:
    assert WatchdogConfig().check() == []
    assert WatchdogConfig(warn_min_s=0).check() == [("warn_min_s", "must be > 0, got 0")]
    assert WatchdogConfig(warn_min_s=100, stop_min_s=50).check() == [
        ("stop_min_s", "must be >= warn_min_s (100), got 50")
    ]
