"""Building a GRPO run: the rollout-based run (`run.rollout.setup_rollout_run`) with GRPO's loss, and that loss from
a repro bundle's config (`replay_loss`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
from nemo_rl_clone.algorithms.loss.registry import ClippedPGLossSection, build_loss
from nemo_rl_clone.algorithms.run.rollout import GivenParts, clipped_pg_loss, setup_rollout_run
from nemo_rl_clone.algorithms.run.state import RunState
from nemo_rl_clone.contract.sampling import TrainingSamplingParams
from nemo_rl_clone.rollout.run import RolloutRun
from nemo_rl_clone.utils.config_validation import as_config, validate_config

# GRPO's checkpointed state is the run state every algorithm shares.
GRPOState = RunState

# GRPO's run: the rollout machinery's run with GRPO's config.
GRPOComponents = RolloutRun[GRPOMasterConfig]


def setup(config: GRPOMasterConfig | Mapping[str, Any], given: GivenParts | None = None) -> GRPOComponents:
    """Build a GRPO run from a config (validated here when given as NeMo-RL's plain dict); resumes from
    ``checkpointing.checkpoint_dir`` if it holds one. ``given``: the tokenizer and datasets a NeMo-RL-style caller
    built (`grpo.nemo_rl_api.setup`)."""
    config = as_config(config, GRPOMasterConfig)
    async_grpo = config.grpo.async_grpo
    return setup_rollout_run(
        config,
        clipped_pg_loss(config.loss_fn, config.policy.generation),
        weight_updates_during_generation=async_grpo.enabled and async_grpo.in_flight_weight_updates,
        given=given,
    )


def replay_loss(section: Mapping[str, Any], sampling: TrainingSamplingParams) -> Any:
    """GRPO's loss from a repro bundle's ``loss_fn`` section (`rollout.replay.replay`'s ``make_loss``); raises
    `ConfigError` on a bad key."""
    loss_cfg = validate_config(dict(section), ClippedPGLossSection)
    return build_loss(loss_cfg.name, "clipped_pg", loss_cfg.loss_config(), sampling)
