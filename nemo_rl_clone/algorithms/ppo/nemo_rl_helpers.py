"""The other names NeMo-RL v0.7.0's ``nemo_rl.algorithms.ppo`` offers its scripts: the tokenizer type, its config
sections and save state as this library's classes, DAPO's dynamic sampling over the ``ppo`` section and
`validate` (the one every rollout-based algorithm uses)."""

from __future__ import annotations

from typing import Any

import torch

from nemo_rl_clone.algorithms.grpo.nemo_rl_batches import keep_groups_with_signal
from nemo_rl_clone.algorithms.grpo.nemo_rl_helpers import TokenizerType
from nemo_rl_clone.algorithms.ppo.config import GAEConfig
from nemo_rl_clone.algorithms.run.rollout import validate
from nemo_rl_clone.algorithms.run.state import RunState
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.utils.config_sections import section_value
from nemo_rl_clone.utils.logger import LoggerConfig
from nemo_rl_clone.utils.timer import Timer

__all__ = ["AdvEstimatorConfig", "PPOLoggerConfig", "PPOSaveState", "TokenizerType", "dynamic_sampling", "validate"]

# ``ppo.adv_estimator``: GAE (with VAPO's decoupled and length-adaptive λ).
AdvEstimatorConfig = GAEConfig
# Every algorithm saves the one shared run state; NeMo-RL's PPO logger section is the LoggerConfig here.
PPOSaveState = RunState
PPOLoggerConfig = LoggerConfig


def dynamic_sampling(
    repeated_batch: BatchedDataDict,
    std: torch.Tensor,
    baseline: torch.Tensor,
    dynamic_sampling_num_gen_batches: int,
    master_config: Any,
    timer: Timer,
    batch_cache: BatchedDataDict | None = None,
) -> tuple[BatchedDataDict, bool, BatchedDataDict | None, dict[str, int]]:
    """DAPO's dynamic sampling over ``master_config``'s ``ppo`` section (`nemo_rl_batches.keep_groups_with_signal`).
    PPO's own training here refuses ``ppo.use_dynamic_sampling``; this helper serves scripts that write their step."""
    loop = section_value(master_config, "ppo")
    return keep_groups_with_signal(
        loop, "ppo", repeated_batch, std, baseline, dynamic_sampling_num_gen_batches, timer, batch_cache
    )
