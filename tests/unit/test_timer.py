import math
import statistics
import time

import pytest

from nemo_rl_clone.utils.timer import REDUCTION_OPS, Timer


def test_nested_labels_are_recorded_flat_and_outer_encloses_inner():
    timer = Timer()
    with timer.time("total_step_time"):
        with timer.time("generation"):
            time.sleep(0.02)
        with timer.time("policy_training"):
            pass
    metrics = timer.get_timing_metrics()
    assert set(metrics) == {"total_step_time", "generation", "policy_training"}
    # sleep() never returns early on Linux; a lower bound is not a flaky timing assertion.
    assert metrics["generation"] >= 0.019
    assert metrics["total_step_time"] >= metrics["generation"] + metrics["policy_training"]


def test_repeated_entries_accumulate_and_reductions_match_recorded_durations():
    timer = Timer()
    recorded = []
    for _ in range(3):
        timer.start("generation")
        recorded.append(timer.stop("generation"))
    assert timer.get_durations("generation") == recorded
    expected = {
        "sum": sum(recorded),
        "mean": sum(recorded) / 3,
        "max": max(recorded),
        "min": min(recorded),
        "count": 3.0,
        "median": sorted(recorded)[1],
        "std": statistics.pstdev(recorded),
    }
    assert set(expected) == set(REDUCTION_OPS)
    for op, value in expected.items():
        assert timer.get_timing_metrics(op)["generation"] == pytest.approx(value, rel=1e-12), op


def test_per_label_reduction_mapping_leaves_unmapped_labels_unreduced():
    timer = Timer()
    for label in ["a", "a", "b", "b"]:
        timer.start(label)
        timer.stop(label)
    metrics = timer.get_timing_metrics({"a": "count", "not_timed_this_step": "max"})
    assert metrics == {"a": 2.0, "b": timer.get_durations("b")}
    assert len(metrics["b"]) == 2


def test_time_records_duration_when_body_raises():
    timer = Timer()
    with pytest.raises(ZeroDivisionError), timer.time("generation"):
        _ = 1 / 0
    assert timer.get_timing_metrics("count") == {"generation": 1.0}
    timer.start("generation")  # the label is no longer running


def test_running_sections_are_not_reported():
    timer = Timer()
    timer.start("total_step_time")
    assert timer.get_timing_metrics() == {}


def test_reentering_a_running_label_is_an_error():
    timer = Timer()
    with (
        timer.time("generation"),
        pytest.raises(ValueError, match="'generation' is already running"),
        timer.time("generation"),
    ):
        pass
    assert timer.get_timing_metrics("count") == {"generation": 1.0}


def test_stop_without_start_names_label_and_running_labels():
    timer = Timer()
    timer.start("total_step_time")
    with pytest.raises(ValueError, match=r"'generation' is not running \(running labels: \['total_step_time'\]\)"):
        timer.stop("generation")


def test_bad_reduction_and_label_errors():
    timer = Timer()
    with timer.time("x"):
        pass
    expected = r"reduction_op must be one of \['sum', 'mean', 'max', 'min', 'count', 'median', 'std'\], got 'p90'"
    with pytest.raises(ValueError, match=expected):
        timer.get_timing_metrics("p90")
    with pytest.raises(ValueError, match=r"reduction_op\['x'\] must be one of"):
        timer.get_timing_metrics({"x": "p50"})
    with pytest.raises(ValueError, match="non-empty string"):
        timer.start("")
    with pytest.raises(KeyError, match="'y' has no recorded durations"):
        timer.get_durations("y")


def test_reset_one_label_or_all():
    timer = Timer()
    for label in ["a", "b"]:
        with timer.time(label):
            pass
    timer.start("c")
    timer.reset("a")
    assert set(timer.get_timing_metrics()) == {"b"}
    timer.reset("a")  # already gone: a no-op, as in NeMo-RL
    assert set(timer.get_timing_metrics()) == {"b"}
    timer.reset()
    assert timer.get_timing_metrics() == {}
    timer.start("c")  # reset abandoned the running section
    assert math.isfinite(timer.stop("c"))
