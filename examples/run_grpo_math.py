"""GRPO on math problems.

    uv run examples/run_grpo_math.py [--config configs/grpo_smollm2_cpu.yaml] [--dry-run] [overrides ...]

With no arguments it runs the embedded default (SmolLM2-135M-Instruct on reasoning-gym arithmetic, CPU, offline).
GPU recipe: ``--config configs/grpo_math_1B.yaml``. The config is validated first (exit code 2 with one line per
problem), printed, and saved as ``config.yaml`` in the run's log directory.
"""

from __future__ import annotations

from pathlib import Path

from nemo_rl_clone.algorithms.run.cli import run_algorithm_cli

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "grpo_smollm2_cpu.yaml"


def main(
    argv: list[str] | None = None, default_config: Path = DEFAULT_CONFIG, description: str = "GRPO on math problems."
) -> None:
    """Validate the config (``--config`` or ``default_config`` plus overrides), print it, and train (with
    ``--dry-run``: check everything and print the plan instead, docs/preflight.md). Bad input: one ``error:`` line
    per problem and exit code 2, not a traceback."""
    run_algorithm_cli("grpo", default_config, argv, description=description)


if __name__ == "__main__":  # vLLM spawns engine processes: the entry point must be import-safe
    main()
