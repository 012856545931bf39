"""The other names NeMo-RL v0.7.0's ``nemo_rl.algorithms.grpo`` offers its scripts (its NeMo-Gym example imports
them all): the types its functions are annotated with, its config sections, `refit_policy_generation` with NeMo-RL's
parameters, and `_should_use_nemo_gym`. The types and sections are this library's own classes (a section given as
NeMo-RL's dict is validated into them once, in ``setup``); the functions are thin adapters on
`nemo_rl_clone.rollout.refit` and the config. Its batch helpers are `nemo_rl_batches`'."""

from __future__ import annotations

from typing import Any, TypeVar

from transformers import PreTrainedTokenizerBase

from nemo_rl_clone.algorithms.grpo.config import AdvEstimatorConfig, AsyncGRPOConfig
from nemo_rl_clone.data.dataloader import StatefulPromptLoader
from nemo_rl_clone.distributed.weight_transfer import DEFAULT_BUCKET_BYTES
from nemo_rl_clone.environments.interfaces import EnvironmentInterface
from nemo_rl_clone.models.generation.interfaces import GenerationInterface
from nemo_rl_clone.models.policy.interfaces import ColocatablePolicyInterface
from nemo_rl_clone.rollout import refit
from nemo_rl_clone.rollout.config import RewardScalingConfig
from nemo_rl_clone.utils.config_sections import section_value
from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.utils.logger import Logger, LoggerConfig
from nemo_rl_clone.utils.timer import Timer

__all__ = [
    "AdvEstimatorConfig",
    "AsyncGRPOConfig",
    "ColocatablePolicyInterface",
    "EnvironmentInterface",
    "GRPOLoggerConfig",
    "GenerationInterface",
    "Logger",
    "RewardScalingConfig",
    "StatefulDataLoader",
    "TokenizerType",
    "_should_use_nemo_gym",
    "refit_policy_generation",
]

TokenizerType = TypeVar("TokenizerType", bound=PreTrainedTokenizerBase)

# NeMo-RL's GRPO logger section adds num_val_samples_to_print to its LoggerConfig; this library's has it.
GRPOLoggerConfig = LoggerConfig

# NeMo-RL's is torchdata's loader; GRPO's `setup` here returns this library's resumable prompt loader, which saves
# and restores its position the same way (`state_dict` / `load_state_dict`).
StatefulDataLoader = StatefulPromptLoader

# The label NeMo-RL times a refit's transfer under, so that a NeMo-RL script reads the same timing key.
REFIT_TIMER_LABEL = "prepare_for_generation/transfer_and_update_weights"


def refit_policy_generation(
    policy: Any,
    policy_generation: GenerationInterface,
    colocated_inference: bool,
    _refit_buffer_size_gb: float | None = None,
    timer: Timer | None = None,
    kv_scales: dict[str, float] | None = None,
) -> None:
    """Copy the policy's current weights into the generation engines (`nemo_rl_clone.rollout.refit`).

    ``colocated_inference``: the engines share the policy's GPUs (weights pass through Ray's object store) or have
    their own (weights are broadcast in buckets of ``_refit_buffer_size_gb`` GiB; default 256 MiB). ``timer``
    records the transfer under NeMo-RL's label. ``kv_scales`` (FP8 KV-cache scales) must be None: FP8 generation is
    not built here. Raises `RefitError` when the engines refuse the weights; they then keep the previous ones."""
    if kv_scales is not None:
        raise UserInputError("kv_scales: not supported yet: FP8 KV-cache scales (FP8 generation); pass None")
    bucket_bytes = DEFAULT_BUCKET_BYTES if _refit_buffer_size_gb is None else int(_refit_buffer_size_gb * 1024**3)
    if bucket_bytes < 1:
        raise UserInputError(f"_refit_buffer_size_gb: must be > 0, got {_refit_buffer_size_gb}")
    if timer is None:
        refit.refit_policy_generation(policy, policy_generation, colocated_inference, bucket_bytes=bucket_bytes)
        return
    with timer.time(REFIT_TIMER_LABEL):
        refit.refit_policy_generation(policy, policy_generation, colocated_inference, bucket_bytes=bucket_bytes)


def _should_use_nemo_gym(master_config: Any) -> bool:
    """Whether the config asks for NeMo-Gym rollouts (``env.should_use_nemo_gym``), as NeMo-RL answers it: when it
    does, the generation section must run vLLM's async engine with its HTTP server exposed. ``master_config``: a
    `MasterConfig` (typed or with NeMo-RL's dict sections) or a dict. NeMo Gym itself is not built here: a config
    that asks for it is refused by name when it is validated (``env.should_use_nemo_gym: not supported yet``)."""
    if not bool(section_value(section_value(master_config, "env"), "should_use_nemo_gym")):
        return False
    vllm_cfg = section_value(section_value(section_value(master_config, "policy"), "generation"), "vllm_cfg")
    for key in ("async_engine", "expose_http_server"):
        if not section_value(vllm_cfg, key):
            raise UserInputError(f"policy.generation.vllm_cfg.{key}: must be true to use NeMo-Gym")
    return True
