"""GRPO's logprob passes and training through the data plane (``data_plane.enabled``): the step's rows are written to
the queue once, each pass hands the policy workers their rows' keys, and the logprobs they compute stay in the
queue until training reads them. The same computations as `train.policy_passes` (docs/data_plane.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nemo_rl_clone.algorithms.grpo.advantages import mask_logprob_mismatch
from nemo_rl_clone.data_plane.worker_mixin import PREV_LOGPROBS, REFERENCE_LOGPROBS
from nemo_rl_clone.models.policy.tq_policy import TQPolicy
from nemo_rl_clone.utils.progress import phase
from nemo_rl_clone.utils.timer import Timer

if TYPE_CHECKING:
    from nemo_rl_clone.algorithms.grpo.components import GRPOComponents


def data_plane_passes(c: GRPOComponents, step: int, timer: Timer, train_data: Any) -> tuple[dict[str, Any], int]:
    """`train.policy_passes` with the rows in the queue. After training, the logprob columns are read back into
    ``train_data`` for the step's sample log and repro bundle, as the plain passes leave them there."""
    cfg, policy = c.config, c.policy
    assert isinstance(policy, TQPolicy)
    meta = policy.write_batch(train_data, step)
    num_masked = 0
    try:
        phase(step, "logprobs")
        with timer.time("policy_and_reference_logprobs"):
            policy.prepare_for_lp_inference()
            threshold = cfg.grpo.seq_logprob_error_threshold
            if cfg.needs_prev_logprobs:
                policy.get_logprobs_from_meta(meta)
            if threshold is not None:
                # the mismatch is judged on the driver: it reads the one column it needs
                train_data[PREV_LOGPROBS] = policy.read_from_dataplane(meta, select_fields=[PREV_LOGPROBS])[
                    PREV_LOGPROBS
                ]
                num_masked = mask_logprob_mismatch(train_data, threshold)
                policy.write_to_dataplane(meta, {"sample_mask": train_data["sample_mask"]})
            if cfg.needs_reference_model:
                policy.get_reference_policy_logprobs_from_meta(meta)
        phase(step, "training")
        with timer.time("policy_training"):
            policy.prepare_for_training()
            train_results = policy.train_from_meta(meta, c.loss_fn)
            policy.finish_training()
        computed = [name for name in (PREV_LOGPROBS, REFERENCE_LOGPROBS) if name in meta.fields]
        if computed:
            train_data.update(policy.read_from_dataplane(meta, select_fields=computed))
    finally:
        policy.finish_step(meta)
    return train_results, num_masked
