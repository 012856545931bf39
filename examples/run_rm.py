"""Bradley-Terry reward-model training (a scalar-head model).

    uv run examples/run_rm.py [--config configs/rm.yaml] [--dry-run] [overrides ...]

With no arguments it runs ``configs/rm.yaml`` (SmolLM2-135M-Instruct on the offline champ data, CPU). The config is
validated first (exit code 2 with one line per problem), printed, and saved as ``config.yaml`` in the run's log
directory; a run whose ``checkpointing.checkpoint_dir`` holds a checkpoint resumes from the latest one.
"""

from __future__ import annotations

from pathlib import Path

from nemo_rl_clone.algorithms.run.cli import run_algorithm_cli

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "rm.yaml"


def main(argv: list[str] | None = None) -> None:
    run_algorithm_cli("rm", DEFAULT_CONFIG, argv, description="Reward-model training.")


if __name__ == "__main__":  # Ray workers import modules by name: the entry point must be import-safe
    main()
