"""Evaluation config: the schema ``examples/run_eval.py`` validates (NeMo-RL's ``evals/eval.yaml`` keys).

Sections: ``eval`` (metric and sampling plan), ``generation`` (the engine: `GenerationConfig` plus ``model_name`` and
``num_prompts_per_step``), ``tokenizer``, ``data``, ``env``, ``cluster`` and an optional ``logger``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from nemo_rl_clone.data.config import DATASET_ENVIRONMENTS, ReasoningGymDataConfig
from nemo_rl_clone.data.datasets import unknown_dataset_message
from nemo_rl_clone.data.datasets.eval_datasets import (
    EVAL_DATASET_NAMES,
    FILE_FORMATS,
    LOCAL_DATASET,
    MULTICHOICE_DATASETS,
    NOT_SHIPPED,
    is_data_file,
)
from nemo_rl_clone.distributed.virtual_cluster import ClusterConfig
from nemo_rl_clone.environments.config import MULTICHOICE_VERIFIER_TYPES, EnvConfig
from nemo_rl_clone.models.generation.config import GenerationConfig
from nemo_rl_clone.models.policy.config import TokenizerConfig
from nemo_rl_clone.utils.config_validation import SectionReads, check_at_least, takes_extra_keys
from nemo_rl_clone.utils.logger import LoggerConfig, check_no_samples_to_print


@dataclass
class EvalConfig(SectionReads):
    """``eval``: ``num_tests_per_prompt`` samples per problem, scored as ``metric`` with ``k = k_value``.

    ``save_path``: a JSONL file that receives one row per sample (null: not written).
    """

    metric: Literal["pass@k", "cons@k"] = "pass@k"
    num_tests_per_prompt: int = 1
    seed: int = 42  # sample j of problem p draws with seed (seed · 1000003 + p) · n + j; also choice shuffles
    k_value: int = 1  # the k of pass@k / cons@k, at most num_tests_per_prompt
    save_path: str | None = None

    def check(self) -> list[tuple[str, str]]:
        problems = check_at_least(self, 1, "num_tests_per_prompt", "k_value")
        if self.k_value > self.num_tests_per_prompt >= 1:
            problems.append(
                (
                    "k_value",
                    f"must be <= num_tests_per_prompt ({self.k_value} > {self.num_tests_per_prompt}): "
                    f"{self.metric} needs at least k samples per problem",
                )
            )
        return problems


@dataclass
class EvalGenerationConfig(GenerationConfig):
    """``generation``: the engine settings of `GenerationConfig`, plus what to load and how many prompts at once.

    ``model_name``: a Hugging Face folder, a built-in name, a hub id, or a checkpoint (``<checkpoint_dir>/step_N``
    or ``<checkpoint_dir>`` for its latest step); see `nemo_rl_clone.evals.checkpoint.resolve_eval_model`.
    ``num_prompts_per_step``: problems per generation batch (each with ``num_tests_per_prompt`` samples); -1: all.
    """

    model_name: str = "SmolLM2-135M-Instruct"
    num_prompts_per_step: int = -1

    def check(self) -> list[tuple[str, str]]:
        problems = super().check()
        if not self.model_name.strip():
            problems.append(("model_name", "must name a model folder, a built-in model, a hub id or a checkpoint"))
        if self.num_prompts_per_step != -1 and self.num_prompts_per_step < 1:
            problems.append(
                ("num_prompts_per_step", f"must be >= 1, or -1 for all prompts, got {self.num_prompts_per_step}")
            )
        if self.backend == "megatron":
            problems.append(
                (
                    "backend",
                    "not supported yet in evaluation: megatron (it samples with a trained policy's workers); use vllm",
                )
            )
        elif not self.colocated.enabled:
            problems.append(
                (
                    "colocated.enabled",
                    "evaluation runs only generation engines, one per `cluster` bundle; there is nothing to colocate "
                    "with, so leave it true and size the engines with cluster.gpus_per_node / cluster.num_nodes",
                )
            )
        return problems


@dataclass
class EvalDataConfig(SectionReads):
    """``data``: which problems, and how prompts are built from them.

    ``dataset_name``: ``aime2024`` / ``math500`` (the hub, or ``data_path``: a local file in the hub format),
    NeMo-RL's ``math`` (the full MATH test set) and multiple-choice sets ``gpqa`` / ``gpqa_diamond`` / ``mmlu`` /
    ``mmlu_<LANG>`` / ``mmlu_pro`` (their source, or ``data_path`` in the source's format; scored with a
    multiple-choice ``env.math.verifier_type``), ``reasoning_gym`` (its ``validation`` rows, generated offline from
    the ``reasoning_gym`` section), or ``local`` (``data_path`` with columns ``problem_key`` and ``solution_key``).
    """

    dataset_name: str = "aime2024"
    prompt_file: str | None = "examples/prompts/cot.txt"
    system_prompt_file: str | None = None
    max_input_seq_length: int = 512
    data_path: str | None = None
    problem_key: str = "problem"
    solution_key: str = "answer"
    reasoning_gym: ReasoningGymDataConfig | None = None
    # NeMo-RL's form of a local set: ``dataset_name`` is the file's path or http(s) URL, read as ``file_format``
    # (null: by its extension); a file has one split, ``train``.
    split: str | None = None
    file_format: str | None = None  # csv, json, jsonl or parquet (dataset_name "local" only); null: by extension

    def __post_init__(self) -> None:
        if self.dataset_name not in EVAL_DATASET_NAMES and self.data_path is None and is_data_file(self.dataset_name):
            self.dataset_name, self.data_path = LOCAL_DATASET, self.dataset_name

    def check(self) -> list[tuple[str, str]]:
        problems = check_at_least(self, 1, "max_input_seq_length")
        if self.dataset_name in NOT_SHIPPED:
            problems.append(
                (
                    "dataset_name",
                    f"not supported yet: NeMo-RL's {self.dataset_name!r} evaluation set; built here: "
                    f"{', '.join(EVAL_DATASET_NAMES)} (or a file: dataset_name: local, data_path)",
                )
            )
        elif "/" in self.dataset_name:
            problems.append(
                (
                    "dataset_name",
                    f"not supported yet: a hub dataset by id ({self.dataset_name!r}); save it as a file "
                    "and use dataset_name: local, data_path",
                )
            )
        elif self.dataset_name not in EVAL_DATASET_NAMES:
            problems.append(("dataset_name", unknown_dataset_message(self.dataset_name, EVAL_DATASET_NAMES)))
        if self.split not in (None, "train"):
            problems.append(("split", f"not supported yet: split {self.split!r}; a local file has one split, 'train'"))
        if self.file_format not in (None, *FILE_FORMATS):
            problems.append(("file_format", f"must be one of {list(FILE_FORMATS)} or null, got {self.file_format!r}"))
        elif self.file_format is not None and self.dataset_name != LOCAL_DATASET:
            problems.append(("file_format", f"only used by dataset_name 'local', not {self.dataset_name!r}"))
        if (self.dataset_name == "reasoning_gym") != (self.reasoning_gym is not None):
            problems.append(("reasoning_gym", "must be set exactly when dataset_name is 'reasoning_gym'"))
        if self.dataset_name == LOCAL_DATASET and self.data_path is None:
            problems.append(("data_path", "required for dataset_name 'local' (a .jsonl/.json/.parquet/.csv file)"))
        if self.dataset_name == "reasoning_gym" and self.data_path is not None:
            problems.append(("data_path", "not used by 'reasoning_gym' (generated offline); set it to null"))
        if self.dataset_name != LOCAL_DATASET:
            for key, default in (("problem_key", "problem"), ("solution_key", "answer")):
                if getattr(self, key) != default:
                    problems.append((key, f"only used by dataset_name 'local', not {self.dataset_name!r}"))
        return problems

    @property
    def task_name(self) -> str:
        """The environment (``env.<task_name>``) that scores this dataset's answers."""
        return DATASET_ENVIRONMENTS.get(self.dataset_name, "math")


@takes_extra_keys  # NeMo-RL's run_eval.py builds it as MasterConfig(**config); setup names a key it does not know
@dataclass
class EvalMasterConfig(SectionReads):
    """Everything an evaluation reads; each section is validated by its own schema."""

    eval: EvalConfig = field(default_factory=EvalConfig)
    generation: EvalGenerationConfig = field(default_factory=EvalGenerationConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    data: EvalDataConfig = field(default_factory=EvalDataConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    # Optional: with a logger section the summary also goes to metrics.jsonl (and TensorBoard/wandb/MLflow).
    logger: LoggerConfig | None = None

    def check(self) -> list[tuple[str, str]]:
        problems = []
        n = self.eval.num_tests_per_prompt
        greedy = (
            "temperature=0" if self.generation.temperature == 0 else "top_k=1" if self.generation.top_k == 1 else ""
        )
        if greedy and n > 1:
            # Greedy decoding gives the same answer n times: pass@k would equal pass@1 at n times the cost.
            problems.append(
                (
                    "eval.num_tests_per_prompt",
                    f"{n} samples per problem with generation.{greedy} (greedy) are {n} copies of one answer; "
                    "set generation.temperature > 0 and top_k != 1, or num_tests_per_prompt=1",
                )
            )
        max_model_len = self.generation.vllm_cfg.max_model_len
        if self.data.max_input_seq_length > max_model_len:
            problems.append(
                (
                    "data.max_input_seq_length",
                    f"must be <= generation.vllm_cfg.max_model_len ({self.data.max_input_seq_length} > {max_model_len})",
                )
            )
        task = self.data.task_name
        if task not in self.env:
            problems.append((f"env.{task}", f"required: it scores data.dataset_name {self.data.dataset_name!r}"))
        elif task == "math":
            problems += _check_verifier(self.data.dataset_name, self.env[task])
        if "agent" in self.env:  # agent episodes run in GRPO runs only (docs/agents.md)
            problems.append(("env.agent", "not supported yet in evaluation; agent runs use examples/run_grpo.py"))
        problems += check_no_samples_to_print(self.logger, "evaluation")
        return problems


# Built-in sets whose answers are numbers or expressions: a multiple-choice verifier would mark every answer wrong.
# (A `local` file may hold lettered answers, so it may use either verifier.)
_MATH_ANSWER_SETS = ("aime2024", "math500", "gsm8k", "math")


def _check_verifier(dataset_name: str, math_env: object) -> list[tuple[str, str]]:
    """``env.math.verifier_type`` fits the dataset's answers: letters for a multiple-choice set, math otherwise."""
    verifier = getattr(math_env, "verifier_type", None)
    multichoice = verifier in MULTICHOICE_VERIFIER_TYPES
    if dataset_name in MULTICHOICE_DATASETS and not multichoice:
        return [
            (
                "env.math.verifier_type",
                f"must be {' or '.join(MULTICHOICE_VERIFIER_TYPES)} for the multiple-choice set {dataset_name!r} "
                f"(got {verifier!r}, which scores math answers)",
            )
        ]
    if dataset_name in _MATH_ANSWER_SETS and multichoice:
        return [
            (
                "env.math.verifier_type",
                f"{verifier!r} scores answer letters; data.dataset_name {dataset_name!r} has math answers: "
                "set it to null (math)",
            )
        ]
    return []
