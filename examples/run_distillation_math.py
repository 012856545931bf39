"""On-policy distillation on math problems: the student samples, a frozen teacher's top-k logits teach it.

    uv run examples/run_distillation_math.py [--config configs/distillation_smoke.yaml] [--dry-run] [overrides ...]

With no arguments it runs the embedded default (a freshly initialised 2-layer student learning from
SmolLM2-135M-Instruct on reasoning-gym arithmetic, CPU, offline; docs/distillation.md). GPU recipe:
``--config configs/distillation_math.yaml``. The config is validated first (exit code 2 with one line per problem),
printed, and saved as ``config.yaml`` in the run's log directory.
"""

from __future__ import annotations

from pathlib import Path

from nemo_rl_clone.algorithms.rl.distillation_config import DistillationMasterConfig
from nemo_rl_clone.utils.config import load_run_from_cli, print_config
from nemo_rl_clone.utils.config_validation import config_to_dict

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "distillation_smoke.yaml"


def main(argv: list[str] | None = None, default_config: Path = DEFAULT_CONFIG) -> None:
    """Validate the config (``--config`` or ``default_config`` plus overrides), print it, and train (with
    ``--dry-run``: check everything and print the plan instead, docs/preflight.md)."""
    config, dry_run = load_run_from_cli(
        DistillationMasterConfig, default_config, argv, description="On-policy distillation on math problems."
    )
    print_config(config_to_dict(config), title="Distillation config (validated)")

    # Heavy imports only after the config is known to be valid: a typo fails in a second, not after torch loads.
    from nemo_rl_clone.algorithms.distillation import distillation_train, setup
    from nemo_rl_clone.algorithms.run.preflight import run_training

    run_training(config, setup, distillation_train, dry_run)  # bad input: one `error:` line per problem and exit 2


if __name__ == "__main__":  # vLLM spawns engine processes: the entry point must be import-safe
    main()
