"""NeMo-RL v0.7.0's path (``nemo_rl.data.datasets.processed_dataset``) of the processed dataset, presented from
`nemo_rl_clone.data.datasets.common` (a facade: `nemo_rl_clone.facades.FACADES`)."""

from nemo_rl_clone.data.datasets.common import AllTaskProcessedDataset, TokenizerType

__all__ = ["AllTaskProcessedDataset", "TokenizerType"]
