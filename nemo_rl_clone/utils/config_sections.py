"""Reading a config section that comes either as NeMo-RL's dict or as this library's typed dataclass: NeMo-RL's
helpers (``scale_rewards(batch, cfg)``, ``apply_reward_shaping(batch, cfg)``, ...) take either."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def section_value(section: Any, key: str, default: Any = None) -> Any:
    """``section[key]`` of a section given as a dict or as a typed dataclass; ``default`` where the section is None
    or lacks the key."""
    if section is None:
        return default
    if isinstance(section, Mapping):
        return section.get(key, default)
    return getattr(section, key, default)
