"""PPO with a critic on math problems (docs/ppo.md).

    uv run examples/run_ppo.py [--config configs/ppo_smoke.yaml] [--dry-run] [overrides ...]

With no arguments it runs ``configs/ppo_smollm2_cpu.yaml``: the GRPO main job's task (SmolLM2-135M-Instruct on
reasoning-gym arithmetic, CPU, offline) with GAE over a critic's values instead of the group baseline. The config is
validated first (exit code 2 with one line per problem), printed, and saved as ``config.yaml`` in the run's log
directory; a run whose ``checkpointing.checkpoint_dir`` holds a checkpoint resumes the actor and the critic.
"""

from __future__ import annotations

from pathlib import Path

from nemo_rl_clone.algorithms.run.cli import run_algorithm_cli

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "ppo_smollm2_cpu.yaml"


def main(argv: list[str] | None = None) -> None:
    run_algorithm_cli("ppo", DEFAULT_CONFIG, argv, description="PPO with a critic.")


if __name__ == "__main__":  # vLLM spawns engine processes: the entry point must be import-safe
    main()
