"""NeMo-RL v0.7.0's ``configure_generation_config``: the generation settings a script completes from the tokenizer
before setup."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, TypeVar

ConfigT = TypeVar("ConfigT")


def configure_generation_config(
    config: ConfigT,
    tokenizer: Any,
    is_eval: bool = False,
    has_refit_draft_weights: bool = False,
    trains_mtp: bool = False,
) -> ConfigT:
    """``config`` (NeMo-RL's ``policy.generation`` dict, or this library's `GenerationConfig`) with generation
    stopping at the tokenizer's end-of-sequence token when ``stop_token_ids`` is null, as NeMo-RL sets it; changed
    in place and returned.

    NeMo-RL also writes its engines' internal keys here (``_pad_token_id``, ``vllm_cfg.load_format``,
    ``vllm_cfg.skip_tokenizer_init``, ``_mtp_weights_from_refit``, chosen by ``is_eval``,
    ``has_refit_draft_weights`` and ``trains_mtp``); the engines here take the pad token from the tokenizer and load
    the model themselves, so those are not written and the section still validates."""
    if tokenizer.eos_token_id is None:  # nothing to stop at; NeMo-RL would write [None]
        return config
    eos = [tokenizer.eos_token_id]
    if isinstance(config, MutableMapping):
        if config.get("stop_token_ids") is None:
            config["stop_token_ids"] = eos
    elif getattr(config, "stop_token_ids", None) is None:
        config.stop_token_ids = eos  # type: ignore[attr-defined]
    return config
