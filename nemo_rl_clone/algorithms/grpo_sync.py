"""NeMo-RL's path of GRPO over the transfer-queue data plane: ``grpo_train_sync``, the trainer its run_grpo.py picks
when ``data_plane.enabled`` is true. Here it is the one GRPO step (`grpo.train.GRPOSteps`), whose logprob passes and
training go through the queue because the policy is a `TQPolicy` (docs/data_plane.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_rl_clone.algorithms.grpo.nemo_rl_api import grpo_train
from nemo_rl_clone.models.policy.tq_policy import TQPolicy
from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.utils.unsupported_modules import refusing_getattr

__all__ = ["grpo_train_sync"]


def grpo_train_sync(
    policy: Any,
    policy_generation: Any,
    wrapped_dataloader: Any,
    val_dataloader: Any,
    tokenizer: Any,
    loss_fn: Any,
    task_to_env: Mapping[str, Any],
    val_task_to_env: Mapping[str, Any] | None,
    logger: Any,
    checkpointer: Any,
    grpo_save_state: Any,
    master_config: Any,
) -> None:
    """`grpo_train` with NeMo-RL's parts, for a policy built as a `TQPolicy` (``setup(..., policy_factory=)``)."""
    if not isinstance(policy, TQPolicy):
        raise UserInputError(
            f"grpo_train_sync: the policy is a {type(policy).__name__}, not a TQPolicy; build it through setup's "
            "policy_factory with data_plane.enabled: true"
        )
    grpo_train(
        policy,
        policy_generation,
        wrapped_dataloader,
        val_dataloader,
        tokenizer,
        loss_fn,
        task_to_env,
        val_task_to_env,
        logger,
        checkpointer,
        grpo_save_state,
        master_config,
    )


# Validation generates only: no policy data goes through the queue, so NeMo-RL's validate_sync (which takes its
# rollout actor) has no counterpart; `grpo.validate` validates.
__getattr__ = refusing_getattr(
    __name__,
    {"validate_sync": "validation through a rollout actor that writes to the data plane (use grpo.validate)"},
)
