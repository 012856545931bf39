"""On-policy distillation on math problems: the student samples, a frozen teacher's top-k logits teach it.

    uv run examples/run_distillation_math.py [--config configs/distillation_smoke.yaml] [--dry-run] [overrides ...]

With no arguments it runs the embedded default (a freshly initialised 2-layer student learning from
SmolLM2-135M-Instruct on reasoning-gym arithmetic, CPU, offline; docs/distillation.md). GPU recipe:
``--config configs/distillation_math.yaml``. The config is validated first (exit code 2 with one line per problem),
printed, and saved as ``config.yaml`` in the run's log directory.
"""

from __future__ import annotations

from pathlib import Path

from nemo_rl_clone.algorithms.run.cli import run_algorithm_cli

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "distillation_smoke.yaml"


def main(argv: list[str] | None = None, default_config: Path = DEFAULT_CONFIG) -> None:
    """Validate the config (``--config`` or ``default_config`` plus overrides), print it, and train (with
    ``--dry-run``: check everything and print the plan instead, docs/preflight.md)."""
    run_algorithm_cli("distillation", default_config, argv, description="On-policy distillation on math problems.")


if __name__ == "__main__":  # vLLM spawns engine processes: the entry point must be import-safe
    main()
