"""Where GRPO's logprob passes and training find the step's rows: handed to the workers by the driver
(`DriverRows`), or with ``data_plane.enabled`` in the queue (`QueueRows`: written once, each pass hands the policy
workers their rows' keys, and the logprobs they compute stay in the queue until training reads them). The passes
themselves are `train.policy_passes`, the same for both (docs/data_plane.md)."""

from __future__ import annotations

from typing import Any

from nemo_rl_clone.data_plane.worker_mixin import PREV_LOGPROBS, REFERENCE_LOGPROBS
from nemo_rl_clone.models.policy.tq_policy import TQPolicy


class DriverRows:
    """The batch handed to the workers with every call; results land in ``train_data``."""

    def __init__(self, policy: Any, train_data: Any) -> None:
        self.policy, self.data = policy, train_data

    def prev_logprobs(self) -> None:
        self.data[PREV_LOGPROBS] = self.policy.get_logprobs(self.data)["logprobs"]

    def read_prev_logprobs(self) -> None:
        """Make ``prev_logprobs`` readable in ``train_data`` (it already is)."""

    def sample_mask_changed(self) -> None:
        """``train_data["sample_mask"]`` changed; the next call hands it over anyway."""

    def reference_logprobs(self) -> None:
        self.data[REFERENCE_LOGPROBS] = self.policy.get_reference_policy_logprobs(self.data)["reference_logprobs"]

    def train(self, loss_fn: Any) -> dict[str, Any]:
        return self.policy.train(self.data, loss_fn)

    def close(self) -> None:
        pass


class QueueRows(DriverRows):
    """The rows written to the queue once (`TQPolicy.write_batch`); each pass hands the workers keys. After
    training the logprob columns are read back into ``train_data`` for the step's sample log and repro bundle, as
    the driver's passes leave them there."""

    def __init__(self, policy: TQPolicy, train_data: Any, step: int) -> None:
        super().__init__(policy, train_data)
        self.meta = policy.write_batch(train_data, step)

    def prev_logprobs(self) -> None:
        self.policy.get_logprobs_from_meta(self.meta)

    def read_prev_logprobs(self) -> None:
        """The mismatch check runs on the driver: it reads the one column it needs."""
        self.data[PREV_LOGPROBS] = self.policy.read_from_dataplane(self.meta, select_fields=[PREV_LOGPROBS])[
            PREV_LOGPROBS
        ]

    def sample_mask_changed(self) -> None:
        self.policy.write_to_dataplane(self.meta, {"sample_mask": self.data["sample_mask"]})

    def reference_logprobs(self) -> None:
        self.policy.get_reference_policy_logprobs_from_meta(self.meta)

    def train(self, loss_fn: Any) -> dict[str, Any]:
        results = self.policy.train_from_meta(self.meta, loss_fn)
        computed = [name for name in (PREV_LOGPROBS, REFERENCE_LOGPROBS) if name in self.meta.fields]
        if computed:
            self.data.update(self.policy.read_from_dataplane(self.meta, select_fields=computed))
        return results

    def close(self) -> None:
        self.policy.finish_step(self.meta)


def step_rows(policy: Any, train_data: Any, step: int) -> DriverRows:
    """`QueueRows` for a `TQPolicy`, else `DriverRows`."""
    return QueueRows(policy, train_data, step) if isinstance(policy, TQPolicy) else DriverRows(policy, train_data)
