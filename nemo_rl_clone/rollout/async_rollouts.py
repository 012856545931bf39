"""Async GRPO (``grpo.async_grpo.enabled``): the engines generate the next steps' rollouts while the trainer trains.

A trajectory collector (a thread of the driver: the work happens in the engine and environment actors, the thread
only issues their calls) draws prompt batches in order and rolls them out with whatever weights the engines hold,
tagging each step's rollouts with that weight version, and puts them into a replay buffer. The trainer takes them in
order. Weights version ``v`` = the policy after ``v`` training steps; step ``s`` trains version ``s - 1``, so
rollouts of version ``v`` are ``s - 1 - v`` steps old when step ``s`` trains on them.

Staleness is bounded where it is created: the collector starts the rollouts for step ``t`` only while
``t - 1 - v <= max_trajectory_age_steps``, otherwise it waits for newer weights (``timing/train/engine_idle``). The
buffer checks the age again when the trainer takes rollouts and drops (and counts) any that are too old.

After each training step the trainer refits the engines: it waits until the collector's current rollout batch is
finished (``timing/train/wait_for_engines``), loads the new weights, and the collector goes on with them. With
``in_flight_weight_updates`` it does not wait: the engines load the weights between two decoding steps of the batch
in flight, whose requests finish with the new weights on their old KV cache (its rollouts keep the version they
started with, so their age is an upper bound). The loss corrects for the age with importance sampling against the
engine's own per-token logprobs (``loss_fn.use_importance_sampling_correction``).

Checkpoints save the prompt loader's position as of the last *trained* rollouts (`TrainedPosition`), not the
collector's, which runs ahead: rollouts in the buffer are not saved, and a resumed run regenerates them from the same
prompts, so no prompt is repeated or skipped.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nemo_rl_clone.data.dataloader import StatefulPromptLoader
from nemo_rl_clone.rollout.step_rollouts import StepRollouts, generate_step_rollouts, refit
from nemo_rl_clone.utils.progress import phase
from nemo_rl_clone.utils.timer import Timer

if TYPE_CHECKING:
    from nemo_rl_clone.rollout.run import RolloutRun

# Waits wake up this often to notice a stop or a collector failure (and to let Ctrl-C through).
_POLL_S = 0.2


class CollectorError(RuntimeError):
    """The trajectory collector failed (an engine or environment died, a rollout raised)."""


class ReplayBuffer:
    """Finished step rollouts in generation order, each tagged with the weight version that generated it.

    Thread-safe: the collector `push`es, the trainer `pop`s; `finish` (no more data) and `fail` (the collector
    died) end the trainer's wait.
    """

    def __init__(self, max_age_steps: int) -> None:
        self.max_age_steps = max_age_steps
        self._cond = threading.Condition()
        self._items: deque[StepRollouts] = deque()
        self._finished = False
        self._error: BaseException | None = None
        self.dropped_groups = 0

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    def push(self, rollouts: StepRollouts) -> None:
        with self._cond:
            self._items.append(rollouts)
            self._cond.notify_all()

    def finish(self) -> None:
        with self._cond:
            self._finished = True
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        with self._cond:
            self._error = error
            self._cond.notify_all()

    def pop(self, trainer_version: int, timeout_s: float | None = None) -> StepRollouts | None:
        """The oldest rollouts at most ``max_age_steps`` versions behind ``trainer_version`` (older ones are dropped
        and their prompt groups counted in ``dropped_groups``); waits until there are some.

        Returns None when the collector finished and the buffer is empty. Raises `CollectorError` when the collector
        failed, `TimeoutError` after ``timeout_s`` without data.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while True:
                while self._items and trainer_version - self._items[0].weight_version > self.max_age_steps:
                    self.dropped_groups += self._items.popleft().num_prompts
                if self._items:
                    return self._items.popleft()
                if self._error is not None:
                    raise CollectorError(
                        f"the trajectory collector failed: {type(self._error).__name__}: {self._error}"
                    ) from self._error
                if self._finished:
                    return None
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"no rollouts arrived within {timeout_s:g} s")
                self._cond.wait(_POLL_S)


class TrainedPosition:
    """The prompt loader's position as of the rollouts trained so far; what checkpoints save and SIGTERM restores.

    Same interface as the loader's (`state_dict`, `load_state_dict`, `completed_epochs`), so checkpointing code
    does not know which one it holds.
    """

    def __init__(self, loader: StatefulPromptLoader) -> None:
        self.batches_per_epoch = loader.batches_per_epoch
        self.state = loader.state_dict()

    def state_dict(self) -> dict[str, int]:
        return dict(self.state)

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.state = dict(state)

    @property
    def completed_epochs(self) -> int:
        return self.state["epoch"] + (1 if self.state["batch_in_epoch"] >= self.batches_per_epoch else 0)


class AsyncRollouts:
    """The async `RolloutSource`: a collector thread feeding a `ReplayBuffer` (module docstring)."""

    def __init__(self, c: RolloutRun, max_age: int, in_flight: bool) -> None:
        self.c = c
        self.max_age = max_age  # max_trajectory_age_steps
        self.in_flight = in_flight  # in_flight_weight_updates
        self.buffer = ReplayBuffer(self.max_age)
        self.position = TrainedPosition(c.dataloader)
        self.engine_lock = threading.Lock()  # held by the collector for one rollout batch, by refit and validation
        self._cond = threading.Condition()  # guards weight_version, _stop and _engine_idle_s
        self._refit_turn = threading.Lock()  # an in-flight refit and the version it publishes, as one step
        self.weight_version = c.state.step
        self._stop = False
        self._engine_idle_s = 0.0
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the trainer's side
    def next(self, step: int, timer: Timer) -> StepRollouts | None:
        if self._thread is None:
            self._start(step, timer)
        phase(step, "waiting for rollouts")
        with timer.time("wait_for_rollouts"):
            rollouts = self.buffer.pop(trainer_version=step - 1)
        if rollouts is None:
            return None
        self.position.load_state_dict(rollouts.loader_state)
        age = float(step - 1 - rollouts.weight_version)
        with self._cond:
            engine_idle, self._engine_idle_s = self._engine_idle_s, 0.0
        rollouts.timing["engine_idle"] = engine_idle
        rollouts.extra_metrics = {
            "trajectory_age_mean": age,  # one weight version per step's rollouts: mean and max agree
            "trajectory_age_max": age,
            "buffer_size": float(len(self.buffer)),
            "dropped_stale_groups": float(self.buffer.dropped_groups),
            "weight_version": float(rollouts.weight_version),
        }
        return rollouts

    def after_training(self, step: int, timer: Timer) -> None:
        """Refit the engines with version ``step``: at once with in-flight weight updates (the batch in flight goes
        on with the new weights), else as soon as they finish their current rollout batch."""
        phase(step, "weight sync")
        # The new version is published before anyone can generate with the new weights: a batch is never tagged
        # with a version older than the weights it started with (its age bound would be too lax).
        if self.in_flight:
            with self._refit_turn:  # a batch starting now waits for the new weights and takes their version
                refit(self.c, timer)
                self._publish_version(step)
        else:
            with timer.time("wait_for_engines"):
                self.engine_lock.acquire()
            try:
                refit(self.c, timer)
                self._publish_version(step)
            finally:
                self.engine_lock.release()

    def _publish_version(self, step: int) -> None:
        with self._cond:
            self.weight_version = step
            self._cond.notify_all()

    def validate(self, step: int, timer: Timer, run: Callable[[], Any]) -> Any:
        with self.engine_lock:  # the engines already hold version ``step`` (refit right after training)
            return run()

    def close(self) -> None:
        """Stop the collector after its current rollout batch (engines being shut down end that batch sooner)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    # ------------------------------------------------------------------ the collector
    def _start(self, step: int, timer: Timer) -> None:
        if self.c.state.step > 0:  # resumed: the engines still hold the initial model
            phase(step, "weight sync")
            refit(self.c, timer)
        self._thread = threading.Thread(target=self._collect, name="trajectory-collector", daemon=True)
        self._thread.start()

    def _collect(self) -> None:
        cfg = self.c.config.loop
        loader = self.c.dataloader
        batches = iter(loader)
        target = self.c.state.step + 1
        try:
            while target <= cfg.max_num_steps and loader.completed_epochs < cfg.max_num_epochs:
                idle_from = time.perf_counter()
                if not self._wait_for_weights(target):
                    return
                with self.engine_lock:  # also idle while the trainer refits or validates
                    with self._cond:
                        self._engine_idle_s += time.perf_counter() - idle_from
                        if self._stop:
                            return
                    with self._refit_turn:  # not half-way through an in-flight refit
                        version = self.weight_version
                    rollouts = generate_step_rollouts(self.c, target, batches, version)
                self.buffer.push(rollouts)
                target += 1
            self.buffer.finish()
        except BaseException as error:  # reported to the trainer by `ReplayBuffer.pop`
            self.buffer.fail(error)

    def _wait_for_weights(self, target: int) -> bool:
        """Wait until rollouts for step ``target`` would be young enough; False when asked to stop."""
        with self._cond:
            while not self._stop and target - 1 - self.weight_version > self.max_age:
                self._cond.wait(_POLL_S)
            return not self._stop
