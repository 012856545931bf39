"""User-input errors found through Ray's wrappers, and the directories a failed start removes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ray.exceptions import ActorDiedError, RayTaskError

from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.models.huggingface import ModelSourceError
from nemo_rl_clone.utils.errors import UserInputError, find_user_input_error
from nemo_rl_clone.utils.run_dirs import check_writable_dir, removed_if_start_fails


def test_user_input_error_is_found_through_ray_task_errors_and_chains() -> None:
    original = DataError("data.data_path: x.jsonl: row 3: field 'messages' is missing or empty")
    task_error = RayTaskError("train", "Traceback (most recent call last): ...", original)
    found = find_user_input_error(task_error.as_instanceof_cause())
    assert found is original
    try:
        try:
            raise task_error
        except RayTaskError as error:
            raise RuntimeError("worker group 'policy' failed") from error
    except RuntimeError as wrapped:
        assert find_user_input_error(wrapped) is original
    assert find_user_input_error(RuntimeError("a real bug")) is None


def test_a_failed_actor_constructor_is_recognised_from_its_text() -> None:
    traceback_text = (
        f"Traceback ...\n  File 'w.py', line 9\n{ModelSourceError.__name__}: policy.model_name: cannot load the weights"
    )
    died = ActorDiedError(RayTaskError("__init__", traceback_text, ValueError("x")))
    died.error_msg = f"The actor died because of an error raised in its creation task, {traceback_text}"
    found = find_user_input_error(died)
    assert found is not None and found.problems == ["policy.model_name: cannot load the weights"]
    died.error_msg = "The actor died ...\nZeroDivisionError: division by zero"
    assert find_user_input_error(died) is None


def test_user_input_error_keeps_one_line_per_problem() -> None:
    assert UserInputError("a: bad", "b: worse\nc: worst").problems == ["a: bad", "b: worse", "c: worst"]


def test_check_writable_dir(tmp_path: Path) -> None:
    assert check_writable_dir(tmp_path / "new" / "dir", "logger.log_dir") is None
    (tmp_path / "file").write_text("")
    assert "is not a directory" in (check_writable_dir(tmp_path / "file" / "sub", "logger.log_dir") or "")
    assert (check_writable_dir("/proc/nrl-test", "checkpointing.checkpoint_dir") or "").startswith(
        "checkpointing.checkpoint_dir: '/proc/nrl-test' cannot be created"
    )


def test_failed_start_removes_only_what_it_created(tmp_path: Path) -> None:
    logs, ckpt = tmp_path / "logs" / "sft", tmp_path / "results" / "sft"
    (logs / "exp_1").mkdir(parents=True)
    calls = []
    with pytest.raises(ValueError), removed_if_start_fails([logs, ckpt], before_removal=lambda: calls.append(1)):
        (logs / "exp_2" / "ray").mkdir(parents=True)
        (ckpt / "tmp_step_0").mkdir(parents=True)
        raise ValueError("setup failed")
    assert calls == [1]
    assert sorted(p.name for p in logs.iterdir()) == ["exp_1"]
    assert not (tmp_path / "results").exists()  # created for this run only, parents included
    assert (tmp_path / "logs").is_dir()

    with removed_if_start_fails([logs], before_removal=lambda: None):  # success keeps everything
        (logs / "exp_2").mkdir()
    assert sorted(p.name for p in logs.iterdir()) == ["exp_1", "exp_2"]


_VERDICT_INSIDE_AN_ENTRY_POINT = """
import sys
from nemo_rl_clone.utils.errors import report_fault, reporting_user_errors
with reporting_user_errors():
    print("step 1: progress", flush=True)
    print("a library's warning", file=sys.stderr, flush=True)
    report_fault("Stopped during step 2: a worker died")
report_fault("after the entry point")
"""


def test_fault_verdicts_reach_stderr_while_an_entry_point_sends_the_rest_to_stdout() -> None:
    """Inside `reporting_user_errors` fd 2 goes to stdout (library noise); a verdict still reaches the real stderr,
    alone, where a Slurm job's .err file looks."""
    done = subprocess.run(
        [sys.executable, "-c", _VERDICT_INSIDE_AN_ENTRY_POINT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["step 1: progress", "a library's warning"]
    assert done.stderr.splitlines() == ["Stopped during step 2: a worker died", "after the entry point"]
