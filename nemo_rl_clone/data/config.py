"""Data config (``data``): NeMo-RL's keys, typed, plus local-file and reasoning-gym options."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nemo_rl_clone.data.datasets import DATASET_NAMES, unknown_dataset_message
from nemo_rl_clone.utils.config_validation import check_at_least


@dataclass
class ReasoningGymDataConfig:
    """``data.reasoning_gym``: a procedural task generated offline (see ``data/datasets/reasoning_gym.py``)."""

    task: str = "basic_arithmetic"
    task_kwargs: dict[str, Any] = field(default_factory=dict)
    train_size: int = 1000
    val_size: int = 100
    seed: int = 42
    one_shot_example: bool = False

    def check(self) -> list[tuple[str, str]]:
        return check_at_least(self, 1, "train_size") + check_at_least(self, 0, "val_size")


@dataclass
class SlidingPuzzleDataConfig:
    """``data.sliding_puzzle``: how many games to generate; the boards follow ``env.sliding_puzzle_game.cfg``."""

    train_size: int = 1000
    val_size: int = 32
    seed: int = 42

    def check(self) -> list[tuple[str, str]]:
        return check_at_least(self, 1, "train_size") + check_at_least(self, 0, "val_size")


# The environment (``env.<name>``) that scores each dataset's rows, unless ``data.env_name`` says otherwise.
DATASET_ENVIRONMENTS = {"reasoning_gym": "reasoning_gym", "sliding_puzzle": "sliding_puzzle_game", "human_eval": "code"}


@dataclass
class DataConfig:
    dataset_name: str = "OpenMathInstruct-2"
    prompt_file: str | None = "examples/prompts/cot.txt"
    system_prompt_file: str | None = None
    max_input_seq_length: int = 512
    shuffle: bool = True
    num_workers: int = 1
    # A local file (json/jsonl/parquet/csv) in the dataset's hub format, used instead of the hub.
    data_path: str | None = None
    # A local validation file; replaces the dataset's default validation source.
    val_data_path: str | None = None
    # Hub split to load (OpenMathInstruct-2: train, train_1M, train_2M, train_5M).
    split: str | None = None
    # Fraction of the training rows held out for validation; null = the dataset's default.
    split_validation_size: float | None = None
    reasoning_gym: ReasoningGymDataConfig | None = None
    sliding_puzzle: SlidingPuzzleDataConfig | None = None
    # The environment (an ``env`` section) that scores every row; null: the dataset's own (math for math sets).
    env_name: str | None = None

    def check(self) -> list[tuple[str, str]]:
        problems = check_at_least(self, 1, "max_input_seq_length") + check_at_least(self, 0, "num_workers")
        if self.dataset_name not in DATASET_NAMES:
            problems.append(("dataset_name", unknown_dataset_message(self.dataset_name)))
        for generated in ("reasoning_gym", "sliding_puzzle"):
            if (self.dataset_name == generated) != (getattr(self, generated) is not None):
                problems.append((generated, f"must be set exactly when dataset_name is {generated!r}"))
        if self.split_validation_size is not None and not 0.0 <= self.split_validation_size < 1.0:
            problems.append(("split_validation_size", f"must be in [0, 1), got {self.split_validation_size}"))
        return problems

    @property
    def task_name(self) -> str:
        """The environment (``env.<task_name>``) that scores this data's rows."""
        return self.env_name or DATASET_ENVIRONMENTS.get(self.dataset_name, "math")


@dataclass
class SupervisedDataConfig:
    """The ``data`` keys SFT, DPO and reward models share; ``prompt_file`` (a ``{}`` template for the first user
    message) and ``system_prompt_file`` apply to rows that have no system message of their own."""

    dataset_name: str = "champ"
    data_path: str | None = None
    val_data_path: str | None = None
    max_input_seq_length: int = 1024
    shuffle: bool = True
    num_workers: int = 1
    # Fraction of the training rows (champ: of the problems) held out for validation; null = the dataset's default.
    split_validation_size: float | None = None
    prompt_file: str | None = None
    system_prompt_file: str | None = None
    # Rows longer than max_input_seq_length are kept truncated with loss_multiplier 0 (NeMo-RL), so they take a
    # batch slot and train nothing; true drops them when the run starts instead (a log line counts them).
    drop_overlong: bool = False

    def dataset_names(self) -> tuple[str, ...]:
        raise NotImplementedError

    def check(self) -> list[tuple[str, str]]:
        problems = check_at_least(self, 1, "max_input_seq_length") + check_at_least(self, 0, "num_workers")
        names = self.dataset_names()
        if self.dataset_name not in names:
            problems.append(("dataset_name", unknown_dataset_message(self.dataset_name, names)))
        if self.split_validation_size is not None and not 0.0 <= self.split_validation_size < 1.0:
            problems.append(("split_validation_size", f"must be in [0, 1), got {self.split_validation_size}"))
        if self.val_data_path is not None and self.split_validation_size:
            problems.append(
                ("split_validation_size", "give either val_data_path or split_validation_size > 0, not both")
            )
        if self.dataset_name == "champ":
            for key in ("data_path", "val_data_path"):
                if getattr(self, key) is not None:
                    problems.append(
                        (key, "not used by 'champ' (built offline from the champ_dataset package); set null")
                    )
        return problems


@dataclass
class SFTDataConfig(SupervisedDataConfig):
    """``data`` for SFT: chat rows ``{"messages": [...]}`` (see ``data/datasets/sft.py``)."""

    # Hub split (OpenMathInstruct-2 only: train, train_1M, train_2M, train_5M).
    split: str | None = None
    # Key of the message list in each row (openai_format only).
    chat_key: str = "messages"

    def dataset_names(self) -> tuple[str, ...]:
        from nemo_rl_clone.data.datasets.sft import SFT_DATASET_NAMES  # lazy: keeps importing configs cheap

        return SFT_DATASET_NAMES

    def check(self) -> list[tuple[str, str]]:
        problems = super().check()
        if self.split is not None and self.dataset_name != "OpenMathInstruct-2":
            problems.append(("split", f"only used by 'OpenMathInstruct-2', not {self.dataset_name!r}; set it to null"))
        if not self.chat_key:
            problems.append(("chat_key", "must be a non-empty key"))
        if self.dataset_name == "openai_format" and self.data_path is None:
            problems.append(("data_path", "required for 'openai_format' (a local JSONL file)"))
        return problems


@dataclass
class PreferenceDataConfig(SupervisedDataConfig):
    """``data`` for DPO / reward models: rows ``{"context", "chosen", "rejected"}`` (``data/datasets/preference.py``)."""

    def dataset_names(self) -> tuple[str, ...]:
        from nemo_rl_clone.data.datasets.preference import PREFERENCE_DATASET_NAMES  # lazy, as above

        return PREFERENCE_DATASET_NAMES

    def check(self) -> list[tuple[str, str]]:
        problems = super().check()
        if self.dataset_name == "binary_preference" and self.data_path is None:
            problems.append(("data_path", "required for 'binary_preference' (a local JSONL file)"))
        return problems
