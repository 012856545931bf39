"""NeMo-RL v0.7.0's preference datasets (``nemo_rl.data.datasets.preference_datasets``): ``DATASET_REGISTRY``
and `load_preference_dataset`, the ``data.train`` / ``data.validation`` entries of a DPO or RM run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.data.datasets.preference_datasets.binary_preference_dataset import BinaryPreferenceDataset
from nemo_rl_clone.data.datasets.preference_datasets.helpsteer3 import HelpSteer3Dataset
from nemo_rl_clone.data.datasets.preference_datasets.preference_dataset import PreferenceDataset
from nemo_rl_clone.data.datasets.preference_datasets.tulu3 import Tulu3PreferenceDataset
from nemo_rl_clone.data.datasets.raw_dataset import RawDataset
from nemo_rl_clone.data.datasets.utils import dataset_class_for

__all__ = [
    "DATASET_REGISTRY",
    "BinaryPreferenceDataset",
    "HelpSteer3Dataset",
    "PreferenceDataset",
    "Tulu3PreferenceDataset",
    "load_preference_dataset",
]

DATASET_REGISTRY: dict[str, type[RawDataset]] = {
    "HelpSteer3": HelpSteer3Dataset,
    "Tulu3Preference": Tulu3PreferenceDataset,
    "BinaryPreferenceDataset": BinaryPreferenceDataset,
    "PreferenceDataset": PreferenceDataset,
}


def load_preference_dataset(data_config: Mapping[str, Any]) -> RawDataset:
    """The dataset one ``data.train`` / ``data.validation`` entry of a DPO / RM run names: a ``DATASET_REGISTRY``
    name, else a dotted import path of a user's class; built from the whole entry and bound to its prompt files.
    (NeMo-RL binds no processor here: its preference setup processes every entry alike.)"""
    entry = dict(data_config)
    name = entry.get("dataset_name")
    if not isinstance(name, str):
        raise DataError("data.dataset_name: required (a registered dataset name or a dotted class path)")
    dataset = dataset_class_for(name, DATASET_REGISTRY)(**entry)
    dataset.set_task_spec(entry)
    return dataset
