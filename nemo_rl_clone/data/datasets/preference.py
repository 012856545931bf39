"""Preference datasets (DPO, reward models): rows ``{"context": [messages before the answer], "chosen": [assistant
message(s)], "rejected": [assistant message(s)]}``.

Formats (``data.dataset_name``):
- ``HelpSteer3`` (``nvidia/HelpSteer3``, subset ``preference``): ``context`` (list of ``{role, content}``),
  ``response1``, ``response2``, ``overall_preference`` in −3..3 (negative: response1 is better, positive: response2;
  0: a tie, skipped and counted in a log line). Validation: the hub's ``validation`` split.
- ``binary_preference``: local JSONL rows ``{"prompt", "chosen", "rejected"}``, each a string or a list of
  messages (a string prompt is one user message, a string answer one assistant message).
- ``champ``: offline, from the ``champ_dataset`` package (see :mod:`nemo_rl_clone.data.datasets.champ`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nemo_rl_clone.data.datasets import DataError, unknown_dataset_message
from nemo_rl_clone.data.datasets.common import LoadedDataset
from nemo_rl_clone.data.datasets.sft import (
    ChatFormat,
    Messages,
    RowConverter,
    apply_prompt_spec_to_list_rows,
    load_chat_format,
    prompt_spec,
    reject_file_keys,
    required_text,
    to_messages,
)

if TYPE_CHECKING:
    from nemo_rl_clone.data.config import PreferenceDataConfig

PREFERENCE_DATASET_NAMES: tuple[str, ...] = ("HelpSteer3", "binary_preference", "champ")

HELPSTEER3 = ChatFormat(
    "HelpSteer3",
    "nvidia/HelpSteer3",
    "train",
    "validation",
    0.0,
    ("context", "response1", "response2", "overall_preference"),
    hub_subset="preference",
    skip_reason="ties, overall_preference == 0",
)
BINARY_PREFERENCE = ChatFormat("binary_preference", None, "train", None, 0.0, ("prompt", "chosen", "rejected"))


def load_preference_dataset(cfg: PreferenceDataConfig, seed: int) -> LoadedDataset:
    """Load the preference dataset ``cfg`` (the ``data`` section) names; ``seed`` seeds hold-outs."""
    name = cfg.dataset_name
    if name not in PREFERENCE_DATASET_NAMES:
        raise DataError(unknown_dataset_message(name, PREFERENCE_DATASET_NAMES))
    spec = prompt_spec(name, cfg.prompt_file, cfg.system_prompt_file)
    if name == "champ":
        from nemo_rl_clone.data.datasets.champ import load_champ_preference

        reject_file_keys(name, data_path=cfg.data_path, val_data_path=cfg.val_data_path)
        return apply_prompt_spec_to_list_rows(load_champ_preference(cfg.split_validation_size, seed), spec, "context")
    fmt, convert = preference_chat_format(name)
    return load_chat_format(fmt, convert, cfg.data_path, cfg.val_data_path, cfg.split_validation_size, seed, spec)


def preference_chat_format(name: str) -> tuple[ChatFormat, RowConverter]:
    """The format and row converter of a file-or-hub preference dataset (any but ``champ``)."""
    return (HELPSTEER3, helpsteer3_row) if name == "HelpSteer3" else (BINARY_PREFERENCE, binary_preference_row)


def helpsteer3_row(row: Mapping[str, Any], index: int, source: str) -> dict[str, Any] | None:
    """A HelpSteer3 row → a preference row (None for a tie)."""
    preference = row.get("overall_preference")
    if isinstance(preference, bool) or not isinstance(preference, int) or not -3 <= preference <= 3:
        raise DataError(
            f"{source}: row {index}: field 'overall_preference' must be an integer in [-3, 3], got {preference!r}"
        )
    context = to_messages(row.get("context"), "user", index, source, "context")
    response1 = required_text(row, "response1", index, source)
    response2 = required_text(row, "response2", index, source)
    if preference == 0:
        return None
    chosen, rejected = (response1, response2) if preference < 0 else (response2, response1)
    return {
        "context": context,
        "chosen": [{"role": "assistant", "content": chosen}],
        "rejected": [{"role": "assistant", "content": rejected}],
    }


def binary_preference_row(row: Mapping[str, Any], index: int, source: str) -> dict[str, Any]:
    """A ``{"prompt", "chosen", "rejected"}`` row → a preference row."""
    return {
        "context": to_messages(row.get("prompt"), "user", index, source, "prompt"),
        "chosen": _answer(row.get("chosen"), index, source, "chosen"),
        "rejected": _answer(row.get("rejected"), index, source, "rejected"),
    }


def _answer(value: Any, index: int, source: str, field: str) -> Messages:
    messages = to_messages(value, "assistant", index, source, field)
    if messages[-1]["role"] != "assistant":
        raise DataError(f"{source}: row {index}: field {field!r} must end with an assistant message")
    return messages
