"""Data config (``data``): NeMo-RL's keys, typed, plus local-file and reasoning-gym options."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, ClassVar

from nemo_rl_clone.data.datasets import DATASET_NAMES, unknown_dataset_message
from nemo_rl_clone.utils.config_validation import SectionReads, check_at_least


@dataclass
class ReasoningGymDataConfig(SectionReads):
    """``data.reasoning_gym``: a procedural task generated offline (see ``data/datasets/reasoning_gym.py``)."""

    task: str = "basic_arithmetic"  # a reasoning-gym dataset name
    task_kwargs: dict[str, Any] = field(default_factory=dict)  # the task's config fields, e.g. {min_terms: 2}
    train_size: int = 1000  # training rows (questions may repeat in small task spaces)
    val_size: int = 100  # validation rows: distinct questions, none among the training rows
    seed: int = 42  # the generation's seed
    one_shot_example: bool = False  # prefix every question with one solved example in the <answer> format

    def check(self) -> list[tuple[str, str]]:
        return check_at_least(self, 1, "train_size") + check_at_least(self, 0, "val_size")


@dataclass
class SlidingPuzzleDataConfig(SectionReads):
    """``data.sliding_puzzle``: how many games to generate; the boards follow ``env.sliding_puzzle_game.cfg``."""

    train_size: int = 1000  # training games
    val_size: int = 32  # validation games
    seed: int = 42  # the boards' seed

    def check(self) -> list[tuple[str, str]]:
        return check_at_least(self, 1, "train_size") + check_at_least(self, 0, "val_size")


@dataclass
class DataTrainConfig(SectionReads):
    """``data.train`` (NeMo-RL v0.7.0's layout). Each key set here replaces the flat ``data`` key of the same
    meaning: ``dataset_name``, ``split`` (the hub split; "train" is every dataset's default), ``split_validation_size``,
    ``data_path``; ``seed`` seeds the validation hold-out (default: the algorithm's seed)."""

    dataset_name: str | None = None
    split: str | None = None
    split_validation_size: float | None = None
    seed: int | None = None
    data_path: str | None = None
    max_samples: int | None = None  # a cap on the training rows: only null
    output_key: str | None = None  # the answer column: null or "generated_solution" (each dataset reads its own)

    def check(self) -> list[tuple[str, str]]:
        problems = []
        if self.max_samples is not None:
            problems.append(
                ("max_samples", "not supported yet: a cap on the training rows; give a smaller data_path, set null")
            )
        if self.output_key not in (None, "generated_solution"):
            problems.append(
                (
                    "output_key",
                    f"not supported yet: {self.output_key!r}; each dataset reads its own answer column "
                    "(OpenMathInstruct-2: generated_solution); set it to null",
                )
            )
        return problems


@dataclass
class DataValidationConfig(SectionReads):
    """``data.validation`` (NeMo-RL v0.7.0's layout): where validation rows come from. ``dataset_name`` null or the
    training dataset: that dataset's own validation rows (its validation split or hold-out); another name: that
    dataset's validation rows (GRPO only). ``data_path``: a local file (the flat ``val_data_path``). ``repeat``:
    each validation prompt appears this many times (GRPO; each copy is sampled with its own seed)."""

    dataset_name: str | None = None
    split: str | None = None  # null, "validation" or "test": the dataset's own validation rows
    data_path: str | None = None
    repeat: int = 1

    def check(self) -> list[tuple[str, str]]:
        problems = check_at_least(self, 1, "repeat")
        if self.split not in (None, "validation", "test"):
            problems.append(
                (
                    "split",
                    f"not supported yet: {self.split!r}; validation uses the dataset's own validation rows, set "
                    "'validation' or null",
                )
            )
        return problems


@dataclass
class DataDefaultsConfig(SectionReads):
    """``data.default`` (NeMo-RL v0.7.0's layout): settings shared by the train and validation sources; each maps
    onto the flat key of the same name. ``processor`` names NeMo-RL's row processor; the equivalent one here is
    picked by the dataset (math prompts for math sets, chat rows for SFT)."""

    env_name: str | None = None  # the flat data.env_name: the environment that scores every row (GRPO)
    processor: str | None = None
    prompt_file: str | None = None  # the flat data.prompt_file
    system_prompt_file: str | None = None  # the flat data.system_prompt_file

    def check(self) -> list[tuple[str, str]]:
        if self.processor not in _EQUIVALENT_PROCESSORS:
            names = ", ".join(repr(p) for p in _EQUIVALENT_PROCESSORS if p)
            return [
                (
                    "processor",
                    f"not supported yet: {self.processor!r}; the dataset picks its processor here (equivalent to "
                    f"{names}); set one of those or null",
                )
            ]
        return []


# NeMo-RL processors whose work the dataset's own processor does here: the math prompt (GRPO) and chat rows (SFT).
_EQUIVALENT_PROCESSORS = (None, "math_hf_data_processor", "math_data_processor", "sft_processor")


@dataclass
class NeMoRLDataLayout(SectionReads):
    """NeMo-RL v0.7.0's nested ``data`` keys, mapped onto this project's flat ones when the config is built (so
    every reader sees one set of keys). The flat keys keep working; where both are given the nested key wins."""

    # A list (several datasets in one run, NeMo-RL's multiple-dataset form) is refused (utils/unsupported_keys.py).
    train: DataTrainConfig | None = None
    validation: DataValidationConfig | None = None
    default: DataDefaultsConfig | None = None
    use_multiple_dataloader: bool = False  # one loader per dataset: only false (one dataset trains per run)

    def __post_init__(self) -> None:
        flat: dict[str, Any] = {}
        if self.train is not None:
            t = self.train
            flat.update(dataset_name=t.dataset_name, split_validation_size=t.split_validation_size)
            flat.update(data_path=t.data_path, split=None if t.split == "train" else t.split)
        train_name = flat.get("dataset_name") or getattr(self, "dataset_name", None)
        if self.validation is not None and self.validation.dataset_name in (None, train_name):
            flat.update(val_data_path=self.validation.data_path)
        if self.default is not None:
            flat.update(env_name=self.default.env_name)
            flat.update(prompt_file=self.default.prompt_file, system_prompt_file=self.default.system_prompt_file)
        for key, value in flat.items():
            if hasattr(self, key) and (value is not None or key in ("prompt_file", "system_prompt_file")):
                setattr(self, key, value)

    def split_seed(self, algorithm_seed: int) -> int:
        """The seed of validation hold-outs: ``data.train.seed``, else the algorithm's."""
        seed = None if self.train is None else self.train.seed
        return algorithm_seed if seed is None else seed

    def check_layout(self, has: tuple[str, ...]) -> list[tuple[str, str]]:
        """Nested keys that have no flat key to land on in this run's data config (``has``: its flat keys)."""
        problems = []
        if self.use_multiple_dataloader:
            problems.append(
                ("use_multiple_dataloader", "not supported yet: one dataset trains per run here; set it to false")
            )
        if self.train is not None and self.train.split not in (None, "train") and "split" not in has:
            problems.append(("train.split", f"not supported yet: {self.train.split!r}; set 'train' or null"))
        validation = self.validation
        if validation is not None and "other_validation_dataset" not in has:
            train_name = getattr(self, "dataset_name", None)
            if validation.dataset_name not in (None, train_name):
                problems.append(
                    (
                        "validation.dataset_name",
                        f"not supported yet: validation rows come from the training dataset ({train_name!r}) or "
                        "validation.data_path; set it to null or the training dataset",
                    )
                )
            if validation.repeat != 1:
                problems.append(("validation.repeat", "only GRPO repeats validation prompts; set it to 1"))
        if self.default is not None and self.default.env_name is not None and "env_name" not in has:
            problems.append(("default.env_name", "only GRPO runs score rows with an environment; set it to null"))
        return problems


# The environment (``env.<name>``) that scores each dataset's rows, unless ``data.env_name`` says otherwise.
DATASET_ENVIRONMENTS = {"reasoning_gym": "reasoning_gym", "sliding_puzzle": "sliding_puzzle_game", "human_eval": "code"}


@dataclass
class DataConfig(NeMoRLDataLayout):
    dataset_name: str = "OpenMathInstruct-2"  # the prompts' dataset (data/datasets); a near-miss name is refused
    prompt_file: str | None = "examples/prompts/cot.txt"  # a str.format template, {} for the problem; null: as is
    system_prompt_file: str | None = None  # a file whose text is the system message; null: none
    max_input_seq_length: int = 512  # longer prompts are cut to it and train nothing (loss_multiplier 0)
    shuffle: bool = True  # a seeded reshuffle of the training prompts every epoch
    num_workers: int = 1  # accepted; no effect here (NeMo-RL's DataLoader processes; rows load in the driver)
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
    # NeMo-RL's switch for a dataset-specific system prompt; the prompt files here are given explicitly.
    add_system_prompt: bool = False

    def check(self) -> list[tuple[str, str]]:
        problems = check_at_least(self, 1, "max_input_seq_length") + check_at_least(self, 0, "num_workers")
        problems += self.check_layout(("split", "env_name", "other_validation_dataset"))
        problems += _check_dataset_name(self.dataset_name, DATASET_NAMES)
        if self.add_system_prompt:
            problems.append(
                ("add_system_prompt", "not supported yet: give the system prompt as data.default.system_prompt_file")
            )
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


def _check_dataset_name(name: str, names: tuple[str, ...]) -> list[tuple[str, str]]:
    """A name close to a known one is a typo and refused now; other names (NeMo-RL datasets not shipped here)
    validate, and loading the data stops with one line listing the datasets there are."""
    typo = difflib.get_close_matches(name, names, n=1, cutoff=0.8) or [n for n in names if n.lower() == name.lower()]
    if name not in names and typo:
        return [("dataset_name", unknown_dataset_message(name, names))]
    return []


@dataclass
class SupervisedDataConfig(NeMoRLDataLayout):
    """The ``data`` keys SFT, DPO and reward models share; ``prompt_file`` (a ``{}`` template for the first user
    message) and ``system_prompt_file`` apply to rows that have no system message of their own."""

    dataset_name: str = "champ"  # the dataset (names in data/datasets); a near-miss name is refused
    data_path: str | None = None
    val_data_path: str | None = None
    max_input_seq_length: int = 1024  # longer rows are kept truncated and train nothing (see drop_overlong)
    shuffle: bool = True  # a seeded reshuffle of the training rows every epoch
    num_workers: int = 1  # accepted; no effect here (NeMo-RL's DataLoader processes; rows load in the driver)
    # Fraction of the training rows (champ: of the problems) held out for validation; null = the dataset's default.
    split_validation_size: float | None = None
    prompt_file: str | None = None
    system_prompt_file: str | None = None
    # Rows longer than max_input_seq_length are kept truncated with loss_multiplier 0 (NeMo-RL), so they take a
    # batch slot and train nothing; true drops them when the run starts instead (a log line counts them).
    drop_overlong: bool = False

    flat_keys: ClassVar[tuple[str, ...]] = ()

    def dataset_names(self) -> tuple[str, ...]:
        raise NotImplementedError

    def check(self) -> list[tuple[str, str]]:
        problems = check_at_least(self, 1, "max_input_seq_length") + check_at_least(self, 0, "num_workers")
        problems += self.check_layout(self.flat_keys)
        problems += _check_dataset_name(self.dataset_name, self.dataset_names())
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

    flat_keys: ClassVar[tuple[str, ...]] = ("split",)

    # Hub split (OpenMathInstruct-2 only: train, train_1M, train_2M, train_5M).
    split: str | None = None
    # Key of the message list in each row (openai_format only).
    chat_key: str = "messages"
    # Start / end each conversation with the tokenizer's BOS / EOS token where the chat template did not (NeMo-RL's
    # sft.yaml sets both true; false keeps the template's text as is).
    add_bos: bool = False
    add_eos: bool = False  # as add_bos, for the EOS token at the end
    # True: the assistant header before each reply counts as prompt (not trained); false: as the reply's start.
    add_generation_prompt: bool = False

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
