"""Environment configs (``env``): one optional section per environment type."""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from nemo_rl_clone.environments.sandbox import SandboxLimits, SandboxMode
from nemo_rl_clone.utils.config_validation import check_at_least
from nemo_rl_clone.utils.imports import import_by_path

# env.math.verifier_type values scored by `multichoice_verifier` (its MULTICHOICE_VERIFIERS; here to keep config light)
MULTICHOICE_VERIFIER_TYPES = ("english_multichoice", "multilingual_multichoice")

# Kept equal to answer_extraction.ANSWER_EXTRACTION_METHODS (a unit test checks); spelled out here so the config
# validator can name the valid values.
AnswerExtraction = Literal["boxed", "answer_tag", "last_number", "auto"]
# "math_verify": hand the whole response to math-verify, which finds \boxed{} or the last expression itself.
MathAnswerExtraction = Literal["math_verify", "boxed", "answer_tag", "last_number", "auto"]


def _check_pool(
    num_workers: int, verifier_timeout_s: float, answer_extraction: str, valid_extraction: object
) -> list[tuple[str, str]]:
    problems = []
    if answer_extraction not in get_args(valid_extraction):  # the validator checks Literals; hand-built configs not
        valid = ", ".join(get_args(valid_extraction))
        problems.append(("answer_extraction", f"unknown method {answer_extraction!r}; valid: {valid}"))
    if num_workers < 1:
        problems.append(("num_workers", f"must be >= 1, got {num_workers}"))
    if verifier_timeout_s <= 0:
        problems.append(("verifier_timeout_s", f"must be > 0, got {verifier_timeout_s}"))
    return problems


@dataclass
class MathEnvConfig:
    """``num_workers`` verifier actors; ``verifier_timeout_s``: wall-clock limit per response (then it scores 0)."""

    num_workers: int = 8
    # hf_math_verify: math-verify (symbolic equivalence); dapo_math_verify: DAPO's exact match of the normalised
    # "Answer: ..." line (`nemo_rl_clone.environments.dapo_math_verifier`).
    math_verify_impl: Literal["hf_math_verify", "dapo_math_verify"] = "hf_math_verify"
    answer_extraction: MathAnswerExtraction = "math_verify"
    verifier_timeout_s: float = 10.0
    # null / "math": the two above; "english_multichoice" / "multilingual_multichoice": the letter after "Answer:"
    # against the gold letter (environments/multichoice_verifier.py), for GPQA, MMLU and MMLU-Pro.
    verifier_type: str | None = None

    def check(self) -> list[tuple[str, str]]:
        problems = _check_pool(self.num_workers, self.verifier_timeout_s, self.answer_extraction, MathAnswerExtraction)
        if self.verifier_type not in (None, "math", *MULTICHOICE_VERIFIER_TYPES):
            problems.append(
                (
                    "verifier_type",
                    f"not supported yet: NeMo-RL's {self.verifier_type!r} verifier; built here: math, "
                    f"{', '.join(MULTICHOICE_VERIFIER_TYPES)}",
                )
            )
        elif self.verifier_type in MULTICHOICE_VERIFIER_TYPES:
            for key, default in (("math_verify_impl", "hf_math_verify"), ("answer_extraction", "math_verify")):
                if getattr(self, key) != default:
                    problems.append((key, f"only applies with verifier_type math, not {self.verifier_type!r}"))
        return problems

    @property
    def is_multichoice(self) -> bool:
        return self.verifier_type in MULTICHOICE_VERIFIER_TYPES


@dataclass
class MathMultiRewardEnvConfig:
    """``env.math_multi_reward``: as `MathEnvConfig`, the answer read from ``<answer>`` tags (no ``answer_extraction``
    key) and scored by math-verify only (NeMo-RL accepts only ``hf_math_verify`` here)."""

    num_workers: int = 8
    math_verify_impl: Literal["hf_math_verify"] = "hf_math_verify"
    verifier_timeout_s: float = 10.0

    def check(self) -> list[tuple[str, str]]:
        return _check_pool(self.num_workers, self.verifier_timeout_s, "math_verify", MathAnswerExtraction)


@dataclass
class ReasoningGymEnvConfig:
    """Scores reasoning-gym tasks with each task's own ``score_answer`` on the extracted answer.

    ``answer_extraction`` defaults to ``auto`` (answer tag, else \\boxed{}, else the last number): small models
    rarely emit tags, and the last number is what they reliably produce on arithmetic tasks.
    """

    num_workers: int = 2
    answer_extraction: AnswerExtraction = "auto"
    verifier_timeout_s: float = 10.0

    def check(self) -> list[tuple[str, str]]:
        return _check_pool(self.num_workers, self.verifier_timeout_s, self.answer_extraction, AnswerExtraction)


@dataclass
class SlidingPuzzleGameConfig:
    """The puzzles: ``size`` x ``size`` boards, each shuffled by ``shuffle_moves`` random moves from solved."""

    size: int = 3
    shuffle_moves: int = 4

    def check(self) -> list[tuple[str, str]]:
        return check_at_least(self, 2, "size") + check_at_least(self, 1, "shuffle_moves")


@dataclass
class SlidingPuzzleCfg:
    """``max_moves``: moves (turns) an episode may take before it ends unsolved."""

    game_config: SlidingPuzzleGameConfig = field(default_factory=SlidingPuzzleGameConfig)
    max_moves: int = 8

    def check(self) -> list[tuple[str, str]]:
        return check_at_least(self, 1, "max_moves")


@dataclass
class SlidingPuzzleEnvConfig:
    """``env.sliding_puzzle_game`` (NeMo-RL's keys: ``cfg.game_config.{size, shuffle_moves}``, ``cfg.max_moves``)."""

    cfg: SlidingPuzzleCfg = field(default_factory=SlidingPuzzleCfg)


@dataclass
class CodeEnvConfig:
    """``env.code``: ``num_workers`` scorer actors, each running one program at a time. ``timeout_s``: wall clock
    per program; the others are the sandbox's limits (`SandboxLimits`); ``python``: the interpreter programs run
    under (null: found automatically); ``sandbox_mode``: the sandbox's path (auto: root if root, else user
    namespaces, else bwrap; docs/environments.md)."""

    num_workers: int = 2
    timeout_s: float = 10.0
    cpu_time_s: int = 5
    memory_mb: int = 512
    max_processes: int = 8
    max_output_bytes: int = 65536
    max_file_mb: int = 16
    disk_mb: int = 64
    python: str | None = None
    sandbox_mode: SandboxMode = "auto"

    def sandbox_limits(self) -> SandboxLimits:
        return SandboxLimits(
            wall_s=self.timeout_s,
            cpu_s=self.cpu_time_s,
            memory_mb=self.memory_mb,
            max_processes=self.max_processes,
            max_output_bytes=self.max_output_bytes,
            max_file_mb=self.max_file_mb,
            disk_mb=self.disk_mb,
            python=self.python,
            mode=self.sandbox_mode,
        )

    def check(self) -> list[tuple[str, str]]:
        problems = [] if self.num_workers >= 1 else [("num_workers", f"must be >= 1, got {self.num_workers}")]
        renamed = {"wall_s": "timeout_s", "cpu_s": "cpu_time_s", "mode": "sandbox_mode"}
        return problems + [(renamed.get(key, key), message) for key, message in self.sandbox_limits().check()]


@dataclass
class CodeJaccardEnvConfig:
    """``env.code_jaccard`` (NeMo-RL's keys): ``num_workers`` scorer actors. ``stop_strings`` is accepted and, as in
    NeMo-RL, read by nothing: the episode ends after its one turn."""

    num_workers: int = 2
    stop_strings: list[str] | None = None

    def check(self) -> list[tuple[str, str]]:
        return check_at_least(self, 1, "num_workers")


TOOLS = ("calculator", "python")


@dataclass
class ToolUseEnvConfig:
    """``env.tool_use``: the tools the model may call, how many calls an episode may make, how answers are read."""

    tools: list[str] = field(default_factory=lambda: ["calculator"])
    max_tool_calls: int = 4
    answer_extraction: AnswerExtraction = "auto"
    python_timeout_s: float = 5.0  # wall clock of one python tool call (the sandbox's other limits: its defaults)

    def check(self) -> list[tuple[str, str]]:
        problems = check_at_least(self, 0, "max_tool_calls")
        if not self.tools or set(self.tools) - set(TOOLS):
            problems.append(("tools", f"choose from {list(TOOLS)}, got {self.tools}"))
        if self.python_timeout_s <= 0:
            problems.append(("python_timeout_s", f"must be > 0, got {self.python_timeout_s}"))
        return problems


REWARD_MODEL_PRECISIONS = ("float32", "bfloat16")
_ONE_PROCESS = "the reward-model environment runs its model in one process"


@dataclass
class RewardModelResources:
    """Where the scoring actor runs: ``gpus_per_node`` GPUs (0: the CPU) on one node."""

    gpus_per_node: int = 0
    num_nodes: int = 1

    def check(self) -> list[tuple[str, str]]:
        problems = check_at_least(self, 0, "gpus_per_node")
        if self.num_nodes != 1:
            problems.append(("num_nodes", f"{_ONE_PROCESS} on one node; set it to 1 (got {self.num_nodes})"))
        if self.gpus_per_node > 1:
            problems.append(("gpus_per_node", f"{_ONE_PROCESS} on one device; set it to 0 or 1"))
        return problems


@dataclass
class RewardModelTokenizer:
    """``name``: the scorer's tokenizer (null: the checkpoint's saved tokenizer, else the model's)."""

    name: str | None = None


@dataclass
class RewardModelDTensorConfig:
    """NeMo-RL builds its reward model as a training policy, so its recipes carry these keys; scoring runs one
    unsharded forward, so only the values that mean that are accepted."""

    enabled: bool = True
    _v2: bool = True
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    sequence_parallel: bool = False
    tensor_parallel_size: int = 1
    context_parallel_size: int = 1
    custom_parallel_plan: str | None = None

    def check(self) -> list[tuple[str, str]]:
        refused = {
            "enabled": (not self.enabled, "the scorer is a plain (DTensor-backend) model; set it to true"),
            "activation_checkpointing": (
                self.activation_checkpointing,
                "scoring keeps no activations; set it to false",
            ),
            "cpu_offload": (self.cpu_offload, "not supported yet; set it to false"),
            "sequence_parallel": (self.sequence_parallel, f"{_ONE_PROCESS}; set it to false"),
            "tensor_parallel_size": (self.tensor_parallel_size != 1, f"{_ONE_PROCESS}; set it to 1"),
            "context_parallel_size": (self.context_parallel_size != 1, f"{_ONE_PROCESS}; set it to 1"),
            "custom_parallel_plan": (self.custom_parallel_plan is not None, f"{_ONE_PROCESS}; set it to null"),
        }
        return [(key, message) for key, (bad, message) in refused.items() if bad]


@dataclass
class RewardModelSwitch:
    """``enabled``-only sections of NeMo-RL's reward-model config that the scorer does not implement."""

    enabled: bool = False

    def check(self) -> list[tuple[str, str]]:
        return (
            [("enabled", "not supported by the reward-model environment yet; set it to false")] if self.enabled else []
        )


@dataclass
class RewardModelKind:
    """``env.reward_model.reward_model_cfg``: the model is a Bradley-Terry scorer (one scalar per conversation)."""

    enabled: bool = True
    reward_model_type: str = "bradley_terry"

    def check(self) -> list[tuple[str, str]]:
        problems = (
            [] if self.enabled else [("enabled", "the reward-model environment needs a reward model; set it to true")]
        )
        if self.reward_model_type != "bradley_terry":
            problems.append(("reward_model_type", f"must be one of ['bradley_terry'], got {self.reward_model_type!r}"))
        return problems


@dataclass
class RewardModelEnvConfig:
    """``env.reward_model``: a Bradley-Terry reward model scores each finished episode; the reward is its score.

    ``model_name``: a reward model (``*ForSequenceClassification``: a folder, a hub id) or, with ``checkpoint_path``
    (a ``run_rm.py`` checkpoint: its ``checkpoint_dir`` for the latest step, or a ``step_N`` folder), the base model
    it was trained from (null: the checkpoint's). ``batch_size``: conversations per forward; ``max_model_len``: the
    tokens scored per conversation (longer ones keep their last tokens and are counted as truncated).
    """

    enabled: bool = True
    model_name: str | None = None
    checkpoint_path: str | None = None
    tokenizer: RewardModelTokenizer = field(default_factory=RewardModelTokenizer)
    precision: str = "float32"
    batch_size: int = 8
    max_model_len: int = 2048
    resources: RewardModelResources = field(default_factory=RewardModelResources)
    reward_model_cfg: RewardModelKind = field(default_factory=RewardModelKind)
    dtensor_cfg: RewardModelDTensorConfig = field(default_factory=RewardModelDTensorConfig)
    dynamic_batching: RewardModelSwitch = field(default_factory=RewardModelSwitch)
    sequence_packing: RewardModelSwitch = field(default_factory=RewardModelSwitch)
    # Training keys of NeMo-RL's policy config, present in its recipes; nothing is trained here.
    max_grad_norm: float | None = None
    offload_optimizer_for_logprob: bool = False
    processor: str | None = None

    def check(self) -> list[tuple[str, str]]:
        problems = check_at_least(self, 1, "batch_size", "max_model_len")
        if not self.enabled:
            problems.append(("enabled", "set the section to null to switch the environment off"))
        if self.model_name is None and self.checkpoint_path is None:
            problems.append(("model_name", "required: a reward model, or the base model of checkpoint_path"))
        if self.precision not in REWARD_MODEL_PRECISIONS:
            problems.append(("precision", f"must be one of {list(REWARD_MODEL_PRECISIONS)}, got {self.precision!r}"))
        if self.max_grad_norm is not None:
            problems.append(("max_grad_norm", "the reward model is not trained here; set it to null"))
        if self.offload_optimizer_for_logprob:
            problems.append(
                ("offload_optimizer_for_logprob", "the reward model has no optimizer here; set it to false")
            )
        return problems


@dataclass
class CustomEnvConfig:
    """A user's environment: ``env_class`` (``"package.module.Class"``, an `EnvironmentInterface`, plain or
    ``@ray.remote``) and ``cfg``, its own keys: validated against the class's ``config_class`` dataclass when it has
    one, else handed over as a dict."""

    env_class: str
    cfg: Any = None


@dataclass
class AgentEnvConfig:
    """``env.agent``: a user's agent plays each episode against the run's OpenAI-compatible servers (docs/agents.md).

    ``function``: ``path/to/file.py:name`` or ``package.module:name``, an ``async def name(client, row) -> reward``;
    ``concurrency_per_engine``: episodes in flight per engine; ``timeout_s``: wall clock per episode (then it scores
    0 and is counted as a timeout)."""

    function: str = ""
    concurrency_per_engine: int = 8
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        # A file named relative to where the run starts: the actor that imports it may run elsewhere.
        where, sep, name = self.function.rpartition(":")
        if where.endswith(".py") and not where.startswith("/"):
            self.function = f"{os.path.abspath(where)}{sep}{name}"

    def check(self) -> list[tuple[str, str]]:
        from nemo_rl_clone.environments.agent_runner import AgentLoadError, load_agent

        problems = check_at_least(self, 1, "concurrency_per_engine")
        if self.timeout_s <= 0:
            problems.append(("timeout_s", f"must be > 0, got {self.timeout_s}"))
        if not self.function:
            problems.append(("function", "required: the agent, as path/to/file.py:name or package.module:name"))
            return problems
        try:
            load_agent(self.function, "function")
        except AgentLoadError as error:
            key, _, message = str(error).partition(": ")
            problems.append((key, message))
        return problems


# Built-in environments: the config section each reads (their actor classes: environments.ENVIRONMENT_REGISTRY).
BUILTIN_ENV_CONFIGS: dict[str, type] = {
    "math": MathEnvConfig,
    "math_multi_reward": MathMultiRewardEnvConfig,
    "reasoning_gym": ReasoningGymEnvConfig,
    "sliding_puzzle_game": SlidingPuzzleEnvConfig,
    "tool_use": ToolUseEnvConfig,
    "code": CodeEnvConfig,
    "code_jaccard": CodeJaccardEnvConfig,
    "reward_model": RewardModelEnvConfig,
    "agent": AgentEnvConfig,
}


# NeMo Gym's environments run its own servers, which drive the model through an OpenAI-compatible endpoint.
_NEMO_GYM_REASON = (
    "NeMo-Gym environments (the nemo-gym package needs Python >= 3.12"
    + (f"; this is Python {sys.version_info.major}.{sys.version_info.minor}" if sys.version_info < (3, 12) else "")
    + "). An agent that talks to the run's OpenAI-compatible server trains with env.agent (docs/agents.md)"
)

# NeMo-RL environments with no equivalent here, and what to use instead.
_NOT_SUPPORTED_ENVS = {
    "dapo": "a separate DAPO environment; DAPO's scoring is env.math with math_verify_impl: dapo_math_verify "
    "(data.default.env_name: math)",
    **dict.fromkeys(("nemo_gym", "should_use_nemo_gym", "should_log_nemo_gym_responses"), _NEMO_GYM_REASON),
    **dict.fromkeys(
        ("vlm", "clevr-cogent", "geometry3k", "refcoco", "mmau", "mmpr-tiny"),
        "vision and audio environments (vision-language / audio-language models)",
    ),
}


_NEMO_GYM_SWITCHES = ("should_use_nemo_gym", "should_log_nemo_gym_responses")


class EnvConfig(dict[str, Any]):
    """``env``: one section per environment, keyed by the name a dataset row's ``task_name`` routes to.

    A built-in name (`BUILTIN_ENV_CONFIGS`) is validated against its schema; any other section names its class with
    ``env_class`` (`CustomEnvConfig`). A ``null`` section means "not started" (configs switch a default off that
    way). Without an ``env`` section the math environment runs with its defaults.
    """

    def __init__(self, sections: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None) -> None:
        super().__init__({"math": MathEnvConfig()} if sections is None else sections)

    @classmethod
    def convert_config(
        cls, value: Any, key: str, convert: Callable[[Any, Any, str], Any], problems: list[str]
    ) -> EnvConfig | None:
        if not isinstance(value, Mapping):
            problems.append(f"{key}: expected a section (mapping) of environments, got {type(value).__name__}")
            return None
        sections: dict[str, Any] = {}
        for name, section in value.items():
            dotted = f"{key}.{name}"
            if section is None or (section is False and name in _NEMO_GYM_SWITCHES):
                continue  # not started; NeMo-Gym's switches off are NeMo-RL's default
            if isinstance(section, Mapping) and "env_class" in section:
                sections[name] = _convert_custom(section, dotted, convert, problems)
            elif name in BUILTIN_ENV_CONFIGS:
                sections[name] = convert(section, BUILTIN_ENV_CONFIGS[name], dotted)
            elif name in _NOT_SUPPORTED_ENVS:
                problems.append(f"{dotted}: not supported yet: {_NOT_SUPPORTED_ENVS[name]}")
            else:
                near = difflib.get_close_matches(str(name), list(BUILTIN_ENV_CONFIGS), n=1, cutoff=0.6)
                hint = f" (did you mean {key}.{near[0]}?)" if near else ""
                problems.append(
                    f"{dotted}: unknown environment{hint}; built-in: {', '.join(BUILTIN_ENV_CONFIGS)}; for your own, "
                    f"name its class: {dotted}.env_class: package.module.Class"
                )
        return cls(sections)


def _convert_custom(
    section: Mapping[str, Any], key: str, convert: Callable[[Any, Any, str], Any], problems: list[str]
) -> CustomEnvConfig | None:
    custom = convert(section, CustomEnvConfig, key)
    if custom is None:
        return None
    try:
        env_class = load_env_class(custom.env_class)
    except ImportError as error:
        problems.append(f"{key}.env_class: {error}")
        return None
    config_class = getattr(env_class, "config_class", None)
    if config_class is not None:
        custom.cfg = convert({} if custom.cfg is None else custom.cfg, config_class, f"{key}.cfg")
    return custom


def load_env_class(path: str) -> type:
    """The class at ``"package.module.Class"``; for a ``@ray.remote`` class, the class it wraps."""
    found = import_by_path(path)
    return getattr(found, "__ray_actor_class__", found)


def check_env_config(name: str, cfg: Any) -> None:
    """Raises ValueError listing every problem ``cfg.check()`` reports (if it has one), under ``env.<name>``."""
    check = getattr(cfg, "check", None)
    problems = check() if callable(check) else []
    if problems:
        raise ValueError(f"invalid env.{name} config: " + "; ".join(f"{key}: {message}" for key, message in problems))
