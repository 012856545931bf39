"""Async GRPO's replay buffer and trained-position bookkeeping (`rollout/async_rollouts.py`), with threads as the
collector and trainer use them. The whole loop on real engines is in tests/functional/test_grpo_async.py."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from nemo_rl_clone.data.dataloader import StatefulPromptLoader
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.rollout.async_rollouts import CollectorError, ReplayBuffer, TrainedPosition
from nemo_rl_clone.rollout.step_rollouts import StepRollouts


def rollouts(version: int, prompts: int = 2, tag: int = 0) -> StepRollouts:
    return StepRollouts(
        batch=BatchedDataDict(tag=[tag]),
        rewards=torch.zeros(1),
        rollout_metrics={},
        sampling_metrics={},
        generation_performance={},
        timing={},
        weight_version=version,
        loader_state={"epoch": 0, "batch_in_epoch": tag, "seed": 0},
        num_prompts=prompts,
    )


def test_pop_returns_rollouts_in_order_and_drops_too_old_ones():
    buffer = ReplayBuffer(max_age_steps=1)
    for tag, version in enumerate([0, 1, 2, 2]):
        buffer.push(rollouts(version, prompts=3, tag=tag))
    # The trainer at version 2 accepts versions 1 and 2: version 0 (2 steps old) is dropped, its 3 groups counted.
    assert buffer.pop(trainer_version=2).batch["tag"] == [1]
    assert buffer.dropped_groups == 3
    assert [buffer.pop(trainer_version=3).batch["tag"] for _ in range(2)] == [[2], [3]]
    assert len(buffer) == 0 and buffer.dropped_groups == 3


def test_pop_waits_for_the_collector_then_returns_none_at_the_end_of_data():
    buffer = ReplayBuffer(max_age_steps=1)

    def collector() -> None:
        time.sleep(0.3)
        buffer.push(rollouts(0, tag=7))
        time.sleep(0.3)
        buffer.finish()

    threading.Thread(target=collector).start()
    start = time.monotonic()
    assert buffer.pop(trainer_version=0).batch["tag"] == [7]
    assert time.monotonic() - start >= 0.25  # it waited for the push
    assert buffer.pop(trainer_version=1) is None  # finished and empty: no hang


def test_pop_raises_the_collectors_failure_with_its_message():
    buffer = ReplayBuffer(max_age_steps=1)
    threading.Timer(0.2, buffer.fail, args=(RuntimeError("engine rank 0 died"),)).start()
    with pytest.raises(CollectorError, match="the trajectory collector failed: RuntimeError: engine rank 0 died"):
        buffer.pop(trainer_version=0)


def test_pop_times_out_when_asked_to():
    with pytest.raises(TimeoutError, match=r"no rollouts arrived within 0\.3 s"):
        ReplayBuffer(max_age_steps=1).pop(trainer_version=0, timeout_s=0.3)


def test_trained_position_counts_epochs_like_the_loader():
    loader = StatefulPromptLoader(list(range(6)), 2, list, shuffle=False)  # 3 batches per epoch
    position = TrainedPosition(loader)
    assert position.completed_epochs == 0
    batches = iter(loader)
    states = []
    for _ in range(4):
        next(batches)
        states.append(loader.state_dict())
    # The collector's loader is 4 batches in (one into epoch 1); the trainer has trained 2 of them: epoch 0 is not
    # done for the trainer, though it is for the loader.
    assert loader.completed_epochs == 1
    position.load_state_dict(states[1])
    assert position.completed_epochs == 0
    position.load_state_dict(states[2])  # the trainer took epoch 0's last batch
    assert position.completed_epochs == 1
    assert position.state_dict() == states[2] == {"epoch": 0, "batch_in_epoch": 3, "seed": 0}
