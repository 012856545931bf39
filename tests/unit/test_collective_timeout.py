"""``watchdog.collective_timeout_s``: a rank whose peer never joins a collective fails once the timeout has passed,
in every kind of process group a policy worker makes (the default group, a sub-group torch makes without a timeout of
its own as a DeviceMesh does, Megatron's groups), and the run's stop line names the worker and the collective.

Without the timeout these collectives wait torch's default (gloo: 30 minutes), so today's code fails by hanging
into the test's time limit. Two processes forked from the suite's forkserver (`spawn`), gloo on CPU.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from nemo_rl_clone.algorithms.run.stop import collective_timeout, stopped_worker
from nemo_rl_clone.distributed.worker_placement import COLLECTIVE_TIMEOUT_ENV, collective_timeout_env
from nemo_rl_clone.utils.watchdog import WatchdogConfig
from tests.unit.test_megatron_policy import spawn

TIMEOUT_S = 1.0


def _peer_never_joins(kind: str, done: str) -> tuple[str, float]:
    """Rank 0's error and how long its all-reduce waited, where rank 1 stays alive but never joins it (until rank 0
    leaves the file ``done``)."""
    from nemo_rl_clone.models.policy.workers.worker_setup import init_distributed

    init_distributed()
    group = None
    if kind == "sub_group":
        group = dist.new_group([0, 1])
    elif kind == "megatron":
        from megatron.core import parallel_state

        from nemo_rl_clone.models.policy.megatron.model import Parallelism, init_model_parallel

        init_model_parallel(Parallelism(tensor=2, pipeline=1))
        group = parallel_state.get_tensor_model_parallel_group()
    if dist.get_rank() == 1:
        deadline = time.monotonic() + 120  # alive but absent: rank 0 must time out, not meet a closed connection
        while not Path(done).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return "", 0.0
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1), group=group)
        outcome = "the all-reduce completed"
    except RuntimeError as error:
        outcome = str(error)
    waited = time.monotonic() - start
    Path(done).touch()
    return outcome, waited


@pytest.mark.parametrize("kind", ["default", "sub_group", "megatron"])
def test_a_collective_whose_peer_never_joins_fails_after_the_timeout(kind, monkeypatch, tmp_path):
    monkeypatch.setenv(COLLECTIVE_TIMEOUT_ENV, str(TIMEOUT_S))  # as the worker group sets it (below)
    message, waited = spawn(2, _peer_never_joins, kind, str(tmp_path / "done"))
    assert "Timed out" in message, message
    assert waited >= TIMEOUT_S * 0.9  # it waited for the configured bound, not less

    # the line the run stops with: the worker call (the note the driver adds) and gloo's words
    error = RuntimeError(f"ray::lm_policy-0.train() (pid=1, ip=127.0.0.1)\n  ...\nRuntimeError: {message}")
    error.add_note("raised by worker rank 0 in lm_policy.train")
    line = stopped_worker(RuntimeError("training failed"))  # not a timeout
    assert line is None
    try:
        raise RuntimeError("the step failed") from error  # found through the cause too
    except RuntimeError as wrapped:
        line = stopped_worker(wrapped)
    assert line is not None and line.startswith("a collective timed out (raised by worker rank 0 in lm_policy.train): ")
    assert "Timed out" in line and line.endswith("(watchdog.collective_timeout_s)") and "\n" not in line


def test_the_timeout_reaches_every_worker_and_is_checked():
    # what a worker group adds to each worker's environment (the worker-group test checks it arrives)
    assert collective_timeout_env(2.5) == {COLLECTIVE_TIMEOUT_ENV: "2.5"} and collective_timeout_env(None) == {}
    assert WatchdogConfig(collective_timeout_s=0).check() == [("collective_timeout_s", "must be > 0 or null, got 0")]
    assert WatchdogConfig().check() == [] and collective_timeout(RuntimeError("connection reset by peer")) is None
