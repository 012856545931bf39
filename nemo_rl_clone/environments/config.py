"""Environment configs (``env``): one optional section per environment type."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional


@dataclass
class MathEnvConfig:
    num_workers: int = 8
    math_verify_impl: Literal["hf_math_verify"] = "hf_math_verify"

    def check(self) -> list[tuple[str, str]]:
        if self.num_workers < 1:
            return [("num_workers", f"must be >= 1, got {self.num_workers}")]
        return []


@dataclass
class EnvConfig:
    math: Optional[MathEnvConfig] = field(default_factory=MathEnvConfig)
