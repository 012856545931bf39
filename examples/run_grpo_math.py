"""GRPO on math problems.

    uv run examples/run_grpo_math.py [--config configs/grpo_smollm2_cpu.yaml] [--dry-run] [overrides ...]

With no arguments it runs the embedded default (SmolLM2-135M-Instruct on reasoning-gym arithmetic, CPU, offline).
GPU recipe: ``--config configs/grpo_math_1B.yaml``. The config is validated first (exit code 2 with one line per
problem), printed, and saved as ``config.yaml`` in the run's log directory.
"""

from __future__ import annotations

from pathlib import Path

from nemo_rl_clone.algorithms.rl.config import GRPOMasterConfig
from nemo_rl_clone.utils.config import load_run_from_cli, print_config
from nemo_rl_clone.utils.config_validation import config_to_dict

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "grpo_smollm2_cpu.yaml"


def main(
    argv: list[str] | None = None, default_config: Path = DEFAULT_CONFIG, description: str = "GRPO on math problems."
) -> None:
    """Validate the config (``--config`` or ``default_config`` plus overrides), print it, and train (with
    ``--dry-run``: check everything and print the plan instead, docs/preflight.md)."""
    config, dry_run = load_run_from_cli(GRPOMasterConfig, default_config, argv, description=description)
    print_config(config_to_dict(config), title="GRPO config (validated)")

    # Heavy imports only after the config is known to be valid: a typo fails in a second, not after torch loads.
    from nemo_rl_clone.algorithms.grpo import grpo_train
    from nemo_rl_clone.algorithms.rl.setup import setup
    from nemo_rl_clone.algorithms.run.preflight import run_training

    run_training(
        config, setup, grpo_train, dry_run
    )  # bad input: one `error:` line per problem and exit 2, not a traceback


if __name__ == "__main__":  # vLLM spawns engine processes: the entry point must be import-safe
    main()
