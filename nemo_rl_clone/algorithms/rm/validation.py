"""Reward-model validation in NeMo-RL v0.7.0's form (`nemo_rl_clone.algorithms.supervised.nemo_rl_validation`):
``validate``, ``validate_one_dataset`` and ``RMValMetrics``."""

from __future__ import annotations

from dataclasses import dataclass

from nemo_rl_clone.algorithms.rm.config import RMAlgorithm
from nemo_rl_clone.algorithms.supervised import nemo_rl_validation as validation


@dataclass
class RMValMetrics:
    """One validation set's metrics: sample-weighted means over its batches, and the summed sample count."""

    loss: float
    accuracy: float
    rewards_chosen_mean: float
    rewards_rejected_mean: float
    num_valid_samples: float


validate_one_dataset, validate = validation.preference_validation(RMAlgorithm, RMValMetrics)
