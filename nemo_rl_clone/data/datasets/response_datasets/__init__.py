"""NeMo-RL v0.7.0's response datasets (``nemo_rl.data.datasets.response_datasets``): ``DATASET_REGISTRY``
(``data.train`` / ``data.validation`` entries' ``dataset_name`` → class) and `load_response_dataset`.

The vision, audio and NeMo-Gym datasets are not built: naming one stops with one line naming the feature.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.data.datasets.raw_dataset import RawDataset
from nemo_rl_clone.data.datasets.response_datasets.aime import AIMEDataset
from nemo_rl_clone.data.datasets.response_datasets.dapo_math import DAPOMath17KDataset, DAPOMathAIME2024Dataset
from nemo_rl_clone.data.datasets.response_datasets.deepscaler import DeepScalerDataset
from nemo_rl_clone.data.datasets.response_datasets.gsm8k import GSM8KDataset
from nemo_rl_clone.data.datasets.response_datasets.helpsteer3 import HelpSteer3Dataset
from nemo_rl_clone.data.datasets.response_datasets.nemotron_cascade2_sft import NemotronCascade2SFTMathDataset
from nemo_rl_clone.data.datasets.response_datasets.oai_format_dataset import OpenAIFormatDataset
from nemo_rl_clone.data.datasets.response_datasets.oasst import OasstDataset
from nemo_rl_clone.data.datasets.response_datasets.openmathinstruct2 import OpenMathInstruct2Dataset
from nemo_rl_clone.data.datasets.response_datasets.response_dataset import ResponseDataset
from nemo_rl_clone.data.datasets.response_datasets.squad import SquadDataset
from nemo_rl_clone.data.datasets.response_datasets.tulu3 import Tulu3SftMixtureDataset
from nemo_rl_clone.data.datasets.utils import dataset_class_for
from nemo_rl_clone.utils.unsupported_modules import refuse_import

__all__ = [
    "DATASET_REGISTRY",
    "AIMEDataset",
    "DAPOMath17KDataset",
    "DAPOMathAIME2024Dataset",
    "DeepScalerDataset",
    "GSM8KDataset",
    "HelpSteer3Dataset",
    "NemotronCascade2SFTMathDataset",
    "OasstDataset",
    "OpenAIFormatDataset",
    "OpenMathInstruct2Dataset",
    "ResponseDataset",
    "SquadDataset",
    "Tulu3SftMixtureDataset",
    "load_response_dataset",
]

DATASET_REGISTRY: dict[str, type[RawDataset]] = {
    "AIME2024": AIMEDataset,
    "DAPOMath17K": DAPOMath17KDataset,
    "DAPOMathAIME2024": DAPOMathAIME2024Dataset,
    "DeepScaler": DeepScalerDataset,
    "gsm8k": GSM8KDataset,
    "HelpSteer3": HelpSteer3Dataset,
    "Nemotron-Cascade-2-SFT-Math": NemotronCascade2SFTMathDataset,
    "open_assistant": OasstDataset,
    "OpenMathInstruct-2": OpenMathInstruct2Dataset,
    "openai_format": OpenAIFormatDataset,
    "ResponseDataset": ResponseDataset,
    "squad": SquadDataset,
    "tulu3_sft_mixture": Tulu3SftMixtureDataset,
}

_MULTIMODAL = "vision and audio inputs (vision-language / audio-language models)"
# NeMo-RL's names of datasets for features not built here → the feature.
REFUSED_DATASETS: dict[str, str] = {
    **dict.fromkeys(
        ("clevr-cogent", "geometry3k", "refcoco", "mmpr-tiny", "avqa", "audiomcq", "daily-omni"), _MULTIMODAL
    ),
    "NemoGymDataset": "NeMo-Gym environments",
    # raw text for a teacher's stored top-k outputs (kd_data_processor)
    "arrow_text": "off-policy (cross-tokenizer) distillation from a teacher's stored outputs",
}


def load_response_dataset(data_config: Mapping[str, Any]) -> RawDataset:
    """The dataset one ``data.train`` / ``data.validation`` entry names: a ``DATASET_REGISTRY`` name, else a dotted
    import path of a user's class (``my_pkg.my_module.MyDataset``). The class is built from the whole entry, then
    bound to its prompt files (``set_task_spec``) and its ``processor`` (``set_processor``)."""
    entry = dict(data_config)
    name = entry.get("dataset_name")
    if not isinstance(name, str):
        raise DataError("data.dataset_name: required (a registered dataset name or a dotted class path)")
    if name in REFUSED_DATASETS:
        refuse_import(f"data.dataset_name {name!r}", REFUSED_DATASETS[name])
    dataset = dataset_class_for(name, DATASET_REGISTRY)(**entry)
    dataset.set_task_spec(entry)
    dataset.set_processor()
    return dataset
