"""NeMo-RL's row processors by its names (``nemo_rl.data.processors``): each reads NeMo-RL's row format and builds
the datum with this library's templating (`build_prompt_datum`, `build_sft_datum`, `build_preference_datum`).

`nemo_rl_clone.data.processors` presents these names; they live here because the supervised datum builders import
the dataset loaders, which import `processors`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.data.interfaces import DatumSpec, PreferenceDatumSpec, TaskDataProcessFn, TaskDataSpec
from nemo_rl_clone.data.llm_message_utils import get_formatted_message_log
from nemo_rl_clone.data.processors import TokenizerType, build_prompt_datum, math_data_processor
from nemo_rl_clone.data.supervised import build_preference_datum, build_sft_datum


def sft_processor(
    datum_dict: dict[str, Any],
    task_data_spec: TaskDataSpec,
    tokenizer: TokenizerType,
    max_seq_length: int,
    idx: int,
    add_bos: bool = True,
    add_eos: bool = True,
    add_generation_prompt: bool = False,
) -> DatumSpec:
    """A chat row ``{"messages", "tools"?}`` → the templated conversation; ``extra_env_info`` is None.

    Beyond NeMo-RL's keys, each message has ``token_loss_mask`` (1 on assistant messages); an over-long
    conversation keeps its first ``max_seq_length`` tokens and gets ``loss_multiplier = 0``.
    """
    messages = _required(datum_dict, "messages", idx)
    datum = build_sft_datum(
        messages,
        tokenizer,
        max_seq_length,
        idx,
        add_bos=add_bos,
        add_eos=add_eos,
        add_generation_prompt=add_generation_prompt,
        task_data_spec=task_data_spec,
        tools=datum_dict.get("tools"),
    )
    return {**datum, "extra_env_info": None}  # type: ignore[typeddict-item]  # NeMo-RL's SFT datum has no task


def preference_preprocessor(
    datum_dict: dict[str, Any],
    task_data_spec: TaskDataSpec,
    tokenizer: TokenizerType,
    max_seq_length: int,
    idx: int,
) -> PreferenceDatumSpec:
    """A row ``{"context": messages, "completions": [{"rank", "completion": messages}] * 2}`` → a preference pair:
    the lower rank is chosen. BOS / EOS are added where the chat template does not put them (NeMo-RL's default)."""
    completions = _required(datum_dict, "completions", idx)
    if len(completions) != 2:
        raise DataError(f"row {idx}: 'completions' must hold exactly two completions, got {len(completions)}")
    first, second = completions
    if first["rank"] == second["rank"]:
        raise DataError(f"row {idx}: 'completions' have the same rank {first['rank']}: ties cannot be trained on")
    chosen, rejected = (first, second) if first["rank"] < second["rank"] else (second, first)
    datum = build_preference_datum(
        _required(datum_dict, "context", idx),
        chosen["completion"],
        rejected["completion"],
        tokenizer,
        max_seq_length,
        idx,
        add_bos=True,
        add_eos=True,
        task_data_spec=task_data_spec,
    )
    return datum  # type: ignore[return-value]  # the builder's dict has exactly PreferenceDatumSpec's keys


def math_hf_data_processor(
    datum_dict: dict[str, Any],
    task_data_spec: TaskDataSpec,
    tokenizer: TokenizerType,
    max_seq_length: int,
    idx: int,
) -> DatumSpec:
    """A row ``{"messages": [user, assistant], "task_name"}`` → a prompt of the user message (through the task's
    template; no system prompt, as NeMo-RL's) with ``extra_env_info = {"ground_truth": <assistant content>}``."""
    messages = _required(datum_dict, "messages", idx)
    if len(messages) < 2:
        raise DataError(f"row {idx}: 'messages' must hold the problem and its answer, got {len(messages)} message(s)")
    prompt_only = TaskDataSpec(task_name=task_data_spec.task_name, prompt=task_data_spec.prompt)
    return build_prompt_datum(
        messages[0]["content"],
        prompt_only,
        tokenizer,
        max_seq_length,
        idx,
        extra_env_info={"ground_truth": messages[1]["content"]},
        task_name=_required(datum_dict, "task_name", idx),
    )


def multichoice_qa_processor(
    datum_dict: dict[str, Any],
    task_data_spec: TaskDataSpec,
    tokenizer: TokenizerType,
    max_seq_length: int,
    idx: int,
) -> DatumSpec:
    """A row ``{"question", "options": {letter: text}, "answer", "subject"?}`` → a prompt: the task's prompt text
    followed by ``"\\n\\nQuestion: ...\\nOptions:\\nA) ..."`` (options that are None left out; without a prompt, the
    question alone); ``extra_env_info = {"ground_truth": answer, "subject"?}``."""
    question = str(_required(datum_dict, "question", idx))
    options: Mapping[str, Any] = _required(datum_dict, "options", idx)
    if task_data_spec.prompt:
        lines = [f"{letter}) {text}" for letter, text in options.items() if text is not None]
        question = f"{task_data_spec.prompt}\n\nQuestion: {question}\nOptions:\n" + "\n".join(lines)
    info: dict[str, Any] = {"ground_truth": str(_required(datum_dict, "answer", idx))}
    if "subject" in datum_dict:
        info["subject"] = datum_dict["subject"]
    system_only = TaskDataSpec(task_name=task_data_spec.task_name, system_prompt=task_data_spec.system_prompt)
    datum = build_prompt_datum(question, system_only, tokenizer, max_seq_length, idx, info, task_name="")
    return _with_row_task_name(datum, datum_dict)


def helpsteer3_data_processor(
    datum_dict: dict[str, Any],
    task_data_spec: TaskDataSpec,
    tokenizer: TokenizerType,
    max_seq_length: int,
    idx: int,
) -> DatumSpec:
    """A HelpSteer3 row ``{"context": str | messages, "response": messages}`` → NeMo-RL's GRPO datum: the whole
    templated conversation (context and preferred response) is the first message's text and tokens, the other
    messages are empty; ``extra_env_info = {"ground_truth": <response contents joined by spaces>}``. Too long: the
    first message keeps ``max_seq_length // len(messages)`` tokens and ``loss_multiplier`` is 0."""
    context = _required(datum_dict, "context", idx)
    response: Sequence[Mapping[str, Any]] = _required(datum_dict, "response", idx)
    messages = [{"role": "user", "content": context}] if isinstance(context, str) else list(context)
    messages += list(response)
    formatted = get_formatted_message_log(messages, tokenizer, add_bos_token=False, add_eos_token=False)
    log = [{"role": m["role"], "content": "", "token_ids": torch.zeros(0, dtype=torch.long)} for m in formatted]
    log[0]["content"] = "".join(m["content"] for m in formatted)
    log[0]["token_ids"] = torch.cat([m["token_ids"] for m in formatted])
    loss_multiplier = 1.0
    if len(log[0]["token_ids"]) > max_seq_length:
        log[0]["token_ids"] = log[0]["token_ids"][: max_seq_length // len(log)]
        loss_multiplier = 0.0
    datum: DatumSpec = {
        "message_log": log,
        "length": len(log[0]["token_ids"]),
        "extra_env_info": {"ground_truth": " ".join(m["content"] for m in response)},
        "loss_multiplier": loss_multiplier,
        "idx": idx,
        "task_name": "",
    }
    return _with_row_task_name(datum, datum_dict)


def _with_row_task_name(datum: DatumSpec, datum_dict: Mapping[str, Any]) -> DatumSpec:
    """NeMo-RL's processors copy the row's ``task_name`` and leave the key out when the row has none."""
    if "task_name" in datum_dict:
        datum["task_name"] = datum_dict["task_name"]
    else:
        del datum["task_name"]  # type: ignore[misc]
    return datum


def _required(datum_dict: Mapping[str, Any], key: str, idx: int) -> Any:
    if datum_dict.get(key) is None:
        raise DataError(f"row {idx}: field {key!r} is missing (row keys: {sorted(datum_dict)})")
    return datum_dict[key]


# NeMo-RL's processor names → functions; ``default`` is NeMo-RL's choice when a dataset names none.
PROCESSOR_REGISTRY: dict[str, TaskDataProcessFn] = {
    "default": math_hf_data_processor,
    "helpsteer3_data_processor": helpsteer3_data_processor,
    "math_data_processor": math_data_processor,
    "math_hf_data_processor": math_hf_data_processor,
    "multichoice_qa_processor": multichoice_qa_processor,
    "sft_processor": sft_processor,
}


def register_processor(processor_name: str, processor_function: TaskDataProcessFn) -> None:
    """Add a processor to `PROCESSOR_REGISTRY` under ``processor_name`` (a name already there is a ValueError)."""
    if processor_name in PROCESSOR_REGISTRY:
        raise ValueError(f"Processor name {processor_name} already registered")
    PROCESSOR_REGISTRY[processor_name] = processor_function
    print(f"[INFO] Dataset processor {processor_name} registered")
