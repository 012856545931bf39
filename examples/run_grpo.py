"""GRPO with data and environments from the config: NeMo-RL's current entry point name.

    uv run examples/run_grpo.py [--config configs/grpo_math_1B.yaml] [--dry-run] [overrides ...]

Same as ``run_grpo_math.py`` (which NeMo-RL renamed to this): the data set, its prompts and the environment that
scores each row all come from the config's ``data`` and ``env`` sections. With no arguments it runs the embedded CPU
default, ``configs/grpo_smollm2_cpu.yaml``.
"""

from __future__ import annotations

from run_grpo_math import DEFAULT_CONFIG
from run_grpo_math import main as run_grpo  # this script's folder is first on sys.path


def main(argv: list[str] | None = None) -> None:
    run_grpo(argv, DEFAULT_CONFIG, "GRPO (data and environments from the config).")


if __name__ == "__main__":  # vLLM spawns engine processes: the entry point must be import-safe
    main()
