"""`utils.signals` handlers in this process and the `distributed.reaper` watchdog with a real, SIGKILLed parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from nemo_rl_clone.utils.signals import RunInterrupted, StopRequested, at_phase, handle_stop_signals

# Runs alone (tests/machine_share.py): the reaper must act within a window of about 2 s.
pytestmark = pytest.mark.serial


def test_sigterm_stops_at_the_next_phase_and_ctrl_c_at_once():
    phases: list[tuple[int, str]] = []
    previous = signal.getsignal(signal.SIGTERM)
    with (
        pytest.raises(StopRequested, match="before step 2: logprobs"),
        handle_stop_signals(60, lambda step, name: phases.append((step, name)), lambda: "no checkpoint") as state,
    ):
        at_phase(2, "generation")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)  # the handler runs between bytecodes; nothing is interrupted
        assert state.sigterm_at is not None and 59 < state.grace_left() <= 60
        at_phase(2, "logprobs")
    assert phases == [(2, "generation"), (2, "logprobs")]
    assert signal.getsignal(signal.SIGTERM) is not previous  # kept after a stop: the shutdown stays bounded
    for timer in state.timers:
        timer.cancel()

    with pytest.raises(RunInterrupted), handle_stop_signals(60, lambda step, name: None, lambda: "") as state:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # interrupted at once
    for timer in state.timers:
        timer.cancel()


def test_handlers_are_restored_after_a_normal_end():
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    with handle_stop_signals(60, lambda step, name: None, lambda: ""):
        at_phase(1, "training")
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    at_phase(1, "training")  # no active run: nothing happens


DRIVER = textwrap.dedent(
    """
    import subprocess, sys, time
    from nemo_rl_clone.distributed.reaper import register_temp_path, start_reaper
    start_reaper()
    register_temp_path(sys.argv[1])
    # A grandchild whose parent exits after 2 s: re-parented to init, it is no descendant of the driver any more.
    code = "import subprocess, time; print(subprocess.Popen(['sleep', '600']).pid, flush=True); time.sleep(2)"
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    print(parent.stdout.readline().strip(), flush=True)
    parent.wait()
    time.sleep(600)
    """
)


def test_reaper_kills_what_a_sigkilled_driver_started_and_removes_its_temp_path(tmp_path):
    temp = tmp_path / "run_tmp"
    temp.mkdir()
    (temp / "file").write_text("x")
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(temp)], stdout=subprocess.PIPE, text=True)
    assert driver.stdout is not None
    orphan = psutil.Process(int(driver.stdout.readline()))
    time.sleep(3)  # its parent has exited: the orphan is init's now, known to the reaper only from its records
    assert orphan.is_running() and orphan.ppid() != driver.pid
    tree = [*psutil.Process(driver.pid).children(recursive=True), orphan]
    driver.kill()
    driver.wait()
    _, alive = psutil.wait_procs(tree, timeout=15)
    assert not alive, alive
    assert not temp.exists()
