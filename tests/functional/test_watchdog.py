"""The progress watchdog on a real run: an engine stopped with SIGSTOP in step 2 is named within the bound, the run stops with
exit code 124, and nothing it started is left running."""

from __future__ import annotations

import re
import signal
import time

import psutil

from nemo_rl_clone.utils.watchdog import WATCHDOG_EXIT_CODE
from tests.functional.supervised_runs import LiveRun
from tests.functional.test_grpo import grpo_args

# Tiny-model phases take about a second: warn after 5 s, stop after 20 s (or 3x / 10x a phase's median if longer);
# on a loaded CI machine a healthy phase of step 1 may pass 5 s and be named too, never 20 s.
BOUNDS = (
    "watchdog.warn_min_s=5",
    "watchdog.warn_factor=3",
    "watchdog.stop_min_s=20",
    "watchdog.stop_factor=10",
    "watchdog.poll_s=0.5",
)


def test_a_stopped_engine_is_named_then_the_run_stops(tmp_path):
    run = LiveRun(grpo_args(tmp_path, "grpo.max_num_steps=10", "grpo.val_period=100", *BOUNDS), tmp_path)
    try:
        run.wait_for_line("step 1: saved checkpoint", timeout_s=300)  # step 2 starts next
        tree = psutil.Process(run.proc.pid).children(recursive=True)
        (engine,) = [p for p in tree if "VllmGenerationWorker" in " ".join(p.cmdline())]
        engine.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        code = run.wait_for_exit(timeout_s=120)
        took = time.monotonic() - stopped_at
        errors = "".join(run.err_lines)
        # the reaper ends every process of the run, the stopped engine included
        _, alive = psutil.wait_procs(tree, timeout=60)
        assert not alive, f"left running: {[p.pid for p in alive]}"
    finally:
        run.kill()
    assert code == WATCHDOG_EXIT_CODE, "".join(run.lines)[-3000:]
    named = rf"vllm_policy-0 \(pid {engine.pid}\) \w+ for \d+ s"
    (warning,) = [line for line in run.err_lines if line.startswith("watchdog: step ") and str(engine.pid) in line]
    # a refit cut by the stop waits on the engine and on the trainer rank sending to it: the engine is among them
    assert re.search(r"has run \d+ s \(warns after \d+ s, stops the run after \d+ s\): waiting on ", warning)
    assert re.search(named, warning), warning
    (verdict,) = [line for line in run.err_lines if line.startswith("Stopped by the watchdog: step ")]
    assert re.search(r"made no progress for \d+ s \(bound \d+ s\): waiting on ", verdict), verdict
    assert re.search(named, verdict), verdict
    assert "last complete checkpoint:" in verdict and "Resume: uv run" in verdict, verdict
    stack = re.search(r"\(stack: (\S+)\)", verdict)
    assert stack, verdict
    with open(stack.group(1)) as dump:  # py-spy's dump of the stopped engine: its Python threads
        assert f"Process {engine.pid}:" in (text := dump.read()) and "Thread " in text, text[:2000]
    assert "Traceback" not in errors, errors[-3000:]
    print(f"stopped {took:.1f} s after SIGSTOP:\n{warning}{verdict}")
