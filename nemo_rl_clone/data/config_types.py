"""NeMo-RL v0.7.0's TypedDicts of ``data`` sections (``nemo_rl.data``, presented there by the package): the dict
shapes its scripts and recipes write, for type-checking user code.

They only type dicts: a run validates its ``data`` section as this library's `DataConfig` / `PreferenceDataConfig`
(training) or ``evals.config.EvalDataConfig`` (evaluation), which name each unknown key, and each dataset not built
here, in one line.
"""

from typing import Literal, NotRequired, TypedDict


class ResponseDatasetConfig(TypedDict):
    """One prompt / chat dataset of ``data.train`` / ``data.validation`` / ``data.default`` (GRPO, SFT,
    distillation)."""

    dataset_name: NotRequired[str]
    data_path: NotRequired[str]
    input_key: NotRequired[str]
    output_key: NotRequired[str]
    subset: NotRequired[str | None]
    split: NotRequired[str]
    prompt_file: NotRequired[str | None]
    system_prompt_file: NotRequired[str | None]
    env_name: NotRequired[str]
    processor: NotRequired[str]
    download_dir: NotRequired[str]
    split_validation_size: NotRequired[float]  # the share of rows held out for validation
    seed: NotRequired[int]  # seeds that hold-out


class PreferenceDatasetConfig(TypedDict):
    """One preference dataset of ``data.train`` / ``data.validation`` (DPO, reward models)."""

    dataset_name: NotRequired[str]
    data_path: NotRequired[str]
    prompt_key: NotRequired[str]
    chosen_key: NotRequired[str]
    rejected_key: NotRequired[str]
    subset: NotRequired[str | None]
    split: NotRequired[str]
    prompt_file: NotRequired[str | None]
    system_prompt_file: NotRequired[str | None]


# The evaluation ``data`` sections, one per family of evaluation sets. NeMo-RL names the sets by Literal values.
MMLULanguage = Literal[
    "mmlu",
    "mmlu_AR-XY",
    "mmlu_BN-BD",
    "mmlu_DE-DE",
    "mmlu_EN-US",
    "mmlu_ES-LA",
    "mmlu_FR-FR",
    "mmlu_HI-IN",
    "mmlu_ID-ID",
    "mmlu_IT-IT",
    "mmlu_JA-JP",
    "mmlu_KO-KR",
    "mmlu_PT-BR",
    "mmlu_ZH-CN",
    "mmlu_SW-KE",
    "mmlu_YO-NG",
]


class MMLUEvalDataConfig(TypedDict):
    max_input_seq_length: int
    dataset_name: MMLULanguage
    prompt_file: NotRequired[str | None]
    system_prompt_file: NotRequired[str | None]


class MMLUProEvalDataConfig(TypedDict):
    max_input_seq_length: int
    dataset_name: Literal["mmlu_pro"]
    prompt_file: NotRequired[str | None]
    system_prompt_file: NotRequired[str | None]


class AIMEEvalDataConfig(TypedDict):
    max_input_seq_length: int
    dataset_name: Literal["aime2024", "aime2025", "aime2026"]
    prompt_file: NotRequired[str | None]
    system_prompt_file: NotRequired[str | None]


class GPQAEvalDataConfig(TypedDict):
    max_input_seq_length: int
    dataset_name: Literal["gpqa", "gpqa_diamond"]
    prompt_file: NotRequired[str | None]
    system_prompt_file: NotRequired[str | None]


class MathEvalDataConfig(TypedDict):
    max_input_seq_length: int
    dataset_name: Literal["math", "math500"]
    prompt_file: NotRequired[str | None]
    system_prompt_file: NotRequired[str | None]


class LocalMathEvalDataConfig(TypedDict):
    """A local file or URL (``dataset_name``) of problems and answers in the columns ``problem_key`` /
    ``solution_key``."""

    max_input_seq_length: int
    dataset_name: str
    problem_key: str
    solution_key: str
    file_format: Literal["csv", "json"]
    split: NotRequired[str | None]
    prompt_file: NotRequired[str | None]
    system_prompt_file: NotRequired[str | None]


# NeMo-RL's union also holds MMAUEvalDataConfig, an audio set (refused by name: `nemo_rl_clone.data`).
EvalDataConfigType = (
    MMLUEvalDataConfig
    | MMLUProEvalDataConfig
    | AIMEEvalDataConfig
    | GPQAEvalDataConfig
    | MathEvalDataConfig
    | LocalMathEvalDataConfig
)
