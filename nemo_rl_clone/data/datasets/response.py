"""NeMo-RL v0.7.0's ``sft_processor``: an SFT row (``messages``, as NeMo-RL's response datasets load it, see
`response_datasets`) → the datum an SFT run trains on (`data.supervised.build_sft_datum`), with the entry's prompt
files applied to its messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_rl_clone.data.datasets.sft import with_prompt_spec
from nemo_rl_clone.data.interfaces import TaskDataSpec
from nemo_rl_clone.utils.errors import UserInputError

__all__ = ["sft_processor"]


def sft_processor(
    datum_dict: Mapping[str, Any],
    task_data_spec: TaskDataSpec | None,
    tokenizer: Any,
    max_seq_length: int | None,
    idx: int,
    add_bos: bool = True,
    add_eos: bool = True,
    add_generation_prompt: bool = False,
) -> dict[str, Any]:
    """An SFT row → the datum an SFT run trains on (`data.supervised.build_sft_datum`: assistant tokens trained,
    ``loss_multiplier`` 0 when truncated); ``task_data_spec``'s prompt formats the first user message and its system
    prompt leads when the row has none."""
    from nemo_rl_clone.data.supervised import build_sft_datum

    if max_seq_length is None:
        raise UserInputError("max_seq_length: required by sft_processor (data.max_input_seq_length)")
    datum = build_sft_datum(
        with_prompt_spec(datum_dict["messages"], task_data_spec),
        tokenizer,
        max_seq_length,
        idx,
        add_bos,
        add_eos,
        add_generation_prompt,
    )
    datum["task_name"] = datum_dict.get("task_name")
    return datum
