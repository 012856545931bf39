"""Data records shared by datasets, processors, rollouts and environments.

A conversation is a *message log*: a list of messages ``{"role", "content", "token_ids"}`` where ``role`` is
``"system" | "user" | "assistant" | "environment"``, ``content`` is the message's text as it appears in the
chat-templated conversation and ``token_ids`` is a 1-D ``torch.long`` tensor of exactly that message's tokens.
Concatenating ``token_ids`` over the messages gives the token sequence the model sees; generated tokens are stored as
generated and never re-tokenised. Later stages may add per-message tensors of the same length (``token_loss_mask``,
``generation_logprobs``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, Protocol, TypedDict

import torch

from nemo_rl_clone.data.multimodal_utils import PackedTensor

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

LLMMessageLogType = list[dict[str, Any]]
# NeMo-RL's names for the same shapes: a vision message may also hold PackedTensor values; a flattened log
# (`message_log_to_flat_messages`) maps each key to one concatenated tensor or a list of per-message values.
VLMMessageLogType = list[dict[str, str | torch.Tensor | PackedTensor]]
FlatMessagesType = dict[str, list[Any] | torch.Tensor]
PathLike = str | os.PathLike[Any]
# Router replay (MoE models): the experts the engine routed each token to, ``[..., layers, k]`` int16, -1 where the
# engine computed no routing. Generation outputs, rollouts and training batches carry it under this key.
ROUTED_EXPERTS = "routed_experts"


def pad_routing(records: list[torch.Tensor | None], width: int) -> torch.Tensor:
    """Per-sample ``[positions, layers, k]`` expert ids (None: none recorded) as one ``[B, width, layers, k]`` int16
    tensor, -1 where a sample has no record."""
    layers, k = next((tuple(r.shape[1:]) for r in records if r is not None and r.numel()), (0, 0))
    routed = torch.full((len(records), width, layers, k), -1, dtype=torch.int16)
    for row, record in enumerate(records):
        if record is not None:
            routed[row, : min(len(record), width)] = record[:width]
    return routed


def merge_routing(earlier: torch.Tensor | None, latest: torch.Tensor) -> torch.Tensor:
    """A multi-turn sample's routing after another turn: each turn's request holds the whole conversation, and a
    position keeps the record of the first turn that computed it (a generated token: the turn that sampled it);
    positions that turn left without a record (its last token, the observation after it) take ``latest``'s."""
    if earlier is None:
        return latest
    merged = latest.clone()
    overlap = min(len(earlier), len(latest))
    kept = earlier[:overlap]
    merged[:overlap] = torch.where(kept >= 0, kept, latest[:overlap])
    return merged


def __getattr__(name: str) -> Any:
    # NeMo-RL's ``TokenizerType`` alias, resolved on first use so importing this module does not load transformers.
    if name == "TokenizerType":
        from transformers import PreTrainedTokenizerBase

        return PreTrainedTokenizerBase
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Relative prompt paths are looked up in the working directory first, then in the project checkout, so the
# NeMo-RL-style default ``examples/prompts/cot.txt`` works from any directory of a source checkout.
_PROJECT_ROOT = Path(__file__).resolve().parents[2]


class DatumSpec(TypedDict):
    """One processed sample, as produced by a data processor and consumed by ``rl_collate_fn``.

    Attributes:
        message_log: the prompt conversation (see module docstring).
        length: total number of tokens over ``message_log``.
        extra_env_info: what the environment needs to score the sample; math: ``{"ground_truth": str}``,
            reasoning-gym: ``{"task": str, "entry": dict}``.
        loss_multiplier: 1.0, or 0.0 when the prompt had to be truncated (the sample then contributes no loss).
        idx: index of the sample in its dataset.
        task_name: routes the sample to its environment (``"math"`` or ``"reasoning_gym"``).
        stop_strings: optional per-sample stop strings for generation.
    """

    message_log: LLMMessageLogType
    length: int
    extra_env_info: dict[str, Any]
    loss_multiplier: float
    idx: int
    task_name: str
    stop_strings: NotRequired[list[str] | None]


class PreferenceDatumSpec(TypedDict):
    """One processed preference pair (DPO / reward-model training)."""

    message_log_chosen: LLMMessageLogType
    message_log_rejected: LLMMessageLogType
    length_chosen: int
    length_rejected: int
    loss_multiplier: float
    idx: int


@dataclass
class TaskDataSpec:
    """How prompts of one task are built: an optional system prompt and an optional user-prompt template.

    The template is a ``str.format`` string with one positional field ``{}`` that receives the problem text;
    literal braces are written ``{{`` ``}}`` (e.g. ``\\boxed{{}}``). Either give a file (``prompt_file``,
    ``system_prompt_file``) or the text itself (``prompt``, ``system_prompt``), not both.
    """

    task_name: str | None = None
    prompt_file: str | None = None
    system_prompt_file: str | None = None
    prompt: str | None = field(default=None)
    system_prompt: str | None = field(default=None)

    def __post_init__(self) -> None:
        if self.prompt_file is not None:
            if self.prompt is not None:
                raise ValueError(f"TaskDataSpec({self.task_name!r}): give prompt_file or prompt, not both")
            self.prompt = _read_prompt_file(self.prompt_file, "prompt_file")
        if self.system_prompt_file is not None:
            if self.system_prompt is not None:
                raise ValueError(
                    f"TaskDataSpec({self.task_name!r}): give system_prompt_file or system_prompt, not both"
                )
            self.system_prompt = _read_prompt_file(self.system_prompt_file, "system_prompt_file")
        if self.prompt is not None:
            _check_template(self.prompt, self.prompt_file or "prompt")

    def copy_defaults(self, from_spec: TaskDataSpec) -> None:
        """Take ``from_spec``'s prompt and system prompt where this spec has none."""
        if self.prompt is None:
            self.prompt = from_spec.prompt
        if self.system_prompt is None:
            self.system_prompt = from_spec.system_prompt

    def format_prompt(self, problem: str) -> str:
        """The user message for ``problem``: the template filled in, or the problem itself without a template."""
        return problem if self.prompt is None else self.prompt.format(problem)


class TaskDataProcessFn(Protocol):
    """Signature of a data processor: one raw row → one :class:`DatumSpec`. Called positionally, so an
    implementation may name its parameters as it likes (NeMo-RL's processors call the row ``datum_dict``)."""

    def __call__(
        self,
        datum_dict: dict[str, Any],
        task_data_spec: TaskDataSpec,
        tokenizer: PreTrainedTokenizerBase,
        max_seq_length: int,
        idx: int,
        /,
    ) -> DatumSpec: ...


TaskDataProcessFnCallable = TaskDataProcessFn  # NeMo-RL's name


class TaskDataPreProcessFnCallable(Protocol):
    """Signature of a row pre-processor: one raw row → the row in the shape a processor expects."""

    def __call__(self, datum_dict: dict[str, Any], /) -> dict[str, Any]: ...


def resolve_prompt_path(path: str) -> Path:
    """``path`` as given if it exists, else relative to the project checkout; raises if neither exists."""
    candidate = Path(path)
    if candidate.is_file():
        return candidate
    in_project = _PROJECT_ROOT / path
    if not candidate.is_absolute() and in_project.is_file():
        return in_project
    raise FileNotFoundError(
        f"prompt file {path!r} not found (looked in {Path.cwd()} and {_PROJECT_ROOT}); "
        "set data.prompt_file / data.system_prompt_file to an existing file or null"
    )


def _read_prompt_file(path: str, key: str) -> str:
    try:
        return resolve_prompt_path(path).read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{key}: {err}") from None


def _check_template(template: str, source: str) -> None:
    """Fail early, naming the file, if the template does not take exactly one positional ``{}`` field."""
    try:
        filled = template.format("\x00PROBLEM\x00")
    except (IndexError, KeyError, ValueError) as err:
        raise ValueError(
            f"prompt template {source!r} must contain exactly one '{{}}' placeholder for the problem, with literal "
            f"braces doubled ('{{{{' and '}}}}', e.g. \\boxed{{{{}}}}); str.format failed: {err!r}"
        ) from None
    if filled.count("\x00PROBLEM\x00") != 1:
        raise ValueError(f"prompt template {source!r} must contain exactly one '{{}}' placeholder for the problem")
