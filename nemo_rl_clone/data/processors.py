"""Data processors: one dataset row → one :class:`DatumSpec` (chat-templated prompt tokens + scoring info).

Rows come from :mod:`nemo_rl_clone.data.datasets` in the common form ``{"problem", "expected_answer",
"task_name"}`` (reasoning-gym rows add ``"extra_env_info"``). The prompt is an optional system message plus a user
message made from the task's template; the chat template's assistant header ends the last message, so the policy
generates the answer right after the prompt tokens.
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizerBase

from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.data.interfaces import DatumSpec, LLMMessageLogType, TaskDataProcessFn, TaskDataSpec
from nemo_rl_clone.data.llm_message_utils import get_formatted_message_log
from nemo_rl_clone.data.sliding_puzzle import MOVE_STOP_STRINGS
from nemo_rl_clone.utils.lazy_exports import lazy_getattr
from nemo_rl_clone.utils.unsupported_modules import refusing_getattr

TokenizerType = PreTrainedTokenizerBase  # NeMo-RL's name

# NeMo-RL's processors over its own row formats (`nemo_rl_processors` imports this module, so they load on use).
_NEMO_RL_NAMES = (
    "PROCESSOR_REGISTRY",
    "helpsteer3_data_processor",
    "math_hf_data_processor",
    "multichoice_qa_processor",
    "preference_preprocessor",
    "register_processor",
    "sft_processor",
)
_lazy_getattr = lazy_getattr("nemo_rl_clone.data", dict.fromkeys(_NEMO_RL_NAMES, "nemo_rl_processors"))
_refusing_getattr = refusing_getattr(
    __name__,
    {
        "vlm_hf_data_processor": "vision and audio inputs (vision-language / audio-language models)",
        "nemo_gym_data_processor": "NeMo-Gym environments",
        "kd_data_processor": "off-policy (cross-tokenizer) distillation from a teacher's stored outputs",
    },
)


def __getattr__(name: str) -> Any:
    return _lazy_getattr(name) if name in _NEMO_RL_NAMES else _refusing_getattr(name)


def math_data_processor(
    datum_dict: dict[str, Any],
    task_data_spec: TaskDataSpec,
    tokenizer: PreTrainedTokenizerBase,
    max_seq_length: int,
    idx: int,
) -> DatumSpec:
    """A math row ``{"problem", "expected_answer"}`` → prompt with ``extra_env_info = {"ground_truth": answer}``."""
    problem = _required_str(datum_dict, "problem", idx)
    answer = _required_str(datum_dict, "expected_answer", idx)
    return build_prompt_datum(
        problem,
        task_data_spec,
        tokenizer,
        max_seq_length,
        idx,
        extra_env_info={"ground_truth": answer},
        task_name=datum_dict.get("task_name") or "math",
    )


def reasoning_gym_data_processor(
    datum: dict[str, Any],
    task_data_spec: TaskDataSpec,
    tokenizer: PreTrainedTokenizerBase,
    max_seq_length: int,
    idx: int,
) -> DatumSpec:
    """A reasoning-gym row → prompt with ``extra_env_info = {"task", "entry"}`` (the task's scorer needs both)."""
    problem = _required_str(datum, "problem", idx)
    info = datum.get("extra_env_info")
    if not isinstance(info, dict) or not isinstance(info.get("task"), str) or not isinstance(info.get("entry"), dict):
        raise DataError(
            f"row {idx}: reasoning_gym rows need extra_env_info = {{'task': str, 'entry': dict}}, got {info!r:.200}"
        )
    return build_prompt_datum(
        problem,
        task_data_spec,
        tokenizer,
        max_seq_length,
        idx,
        extra_env_info={"task": info["task"], "entry": info["entry"]},
        task_name=datum.get("task_name") or "reasoning_gym",
    )


def sliding_puzzle_data_processor(
    datum: dict[str, Any],
    task_data_spec: TaskDataSpec,
    tokenizer: PreTrainedTokenizerBase,
    max_seq_length: int,
    idx: int,
) -> DatumSpec:
    """A game row → its first turn; ``extra_env_info = {"board", "moves"}``; generation stops after the move."""
    problem = _required_str(datum, "problem", idx)
    info = datum.get("extra_env_info")
    if not isinstance(info, dict) or "board" not in info:
        raise DataError(f"row {idx}: sliding-puzzle rows need extra_env_info = {{'board': rows}}, got {info!r:.200}")
    return build_prompt_datum(
        problem,
        task_data_spec,
        tokenizer,
        max_seq_length,
        idx,
        extra_env_info={"board": info["board"], "moves": int(info.get("moves") or 0)},
        task_name=datum.get("task_name") or "sliding_puzzle_game",
        stop_strings=list(MOVE_STOP_STRINGS),
    )


def code_data_processor(
    datum: dict[str, Any],
    task_data_spec: TaskDataSpec,
    tokenizer: PreTrainedTokenizerBase,
    max_seq_length: int,
    idx: int,
) -> DatumSpec:
    """A code row → prompt with ``extra_env_info = {"task_id", "prompt", "test", "entry_point"}`` (what the code
    environment runs); ``expected_answer`` is unused: the tests decide."""
    problem = _required_str(datum, "problem", idx)
    info = datum.get("extra_env_info")
    keys = ("prompt", "test", "entry_point")
    if not isinstance(info, dict) or not all(isinstance(info.get(key), str) and info[key].strip() for key in keys):
        raise DataError(
            f"row {idx}: code rows need extra_env_info with non-empty str 'prompt', 'test' and 'entry_point' "
            f"(and 'task_id'), got {info!r:.200}"
        )
    return build_prompt_datum(
        problem,
        task_data_spec,
        tokenizer,
        max_seq_length,
        idx,
        extra_env_info={key: info.get(key) for key in ("task_id", *keys)},
        task_name=datum.get("task_name") or "code",
    )


# task_name of a row → its processor (see AllTaskProcessedDataset).
DATA_PROCESSORS: dict[str, TaskDataProcessFn] = {
    "math": math_data_processor,
    "reasoning_gym": reasoning_gym_data_processor,
    "code": code_data_processor,
    "sliding_puzzle_game": sliding_puzzle_data_processor,
}


def build_prompt_datum(
    problem: str,
    task_data_spec: TaskDataSpec,
    tokenizer: PreTrainedTokenizerBase,
    max_seq_length: int,
    idx: int,
    extra_env_info: dict[str, Any],
    task_name: str,
    stop_strings: list[str] | None = None,
) -> DatumSpec:
    """Template ``[system?, user]`` with a generation prompt; truncate to ``max_seq_length`` tokens if needed.

    A prompt longer than ``max_seq_length`` cannot be trained on faithfully: it is cut (every message keeps at most
    its share of the budget, and its ``content`` is re-decoded to match) and gets ``loss_multiplier = 0.0``, so the
    sample still flows through the batch but contributes no loss.
    """
    if max_seq_length < 1:
        raise ValueError(f"max_seq_length must be >= 1, got {max_seq_length}")
    messages = []
    if task_data_spec.system_prompt:
        messages.append({"role": "system", "content": task_data_spec.system_prompt})
    messages.append({"role": "user", "content": task_data_spec.format_prompt(problem)})
    message_log = get_formatted_message_log(
        messages, tokenizer, add_bos_token=False, add_eos_token=False, add_generation_prompt=True
    )

    length = sum(len(m["token_ids"]) for m in message_log)
    loss_multiplier = 1.0
    if length > max_seq_length:
        _truncate_in_place(message_log, max_seq_length, tokenizer)
        length = sum(len(m["token_ids"]) for m in message_log)
        loss_multiplier = 0.0
    datum: DatumSpec = {
        "message_log": message_log,
        "length": length,
        "extra_env_info": extra_env_info,
        "loss_multiplier": loss_multiplier,
        "idx": idx,
        "task_name": task_name,
    }
    if stop_strings is not None:
        datum["stop_strings"] = stop_strings
    return datum


def _truncate_in_place(message_log: LLMMessageLogType, max_seq_length: int, tokenizer: PreTrainedTokenizerBase) -> None:
    """Cut messages so that their total is at most ``max_seq_length``: each keeps at most an equal share."""
    share, extra = divmod(max_seq_length, len(message_log))
    for i, message in enumerate(message_log):
        keep = share + (1 if i < extra else 0)
        message["token_ids"] = message["token_ids"][:keep]
        message["content"] = tokenizer.decode(message["token_ids"].tolist(), skip_special_tokens=False)


def _required_str(datum: dict[str, Any], key: str, idx: int) -> str:
    value = datum.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise DataError(f"row {idx}: field {key!r} is missing or empty (row keys: {sorted(datum)})")
    return str(value)
