"""GRPO on math problems.

    uv run examples/run_grpo_math.py [--config configs/grpo_math_1B.yaml] [overrides ...]

The config is loaded, overridden from the command line, validated against the typed schema (exit code 2 with one
line per problem) and printed. The training loop itself arrives with the GRPO issue; until then this entry point
stops after validation.
"""

from __future__ import annotations

from pathlib import Path

from nemo_rl_clone.algorithms.grpo_config import GRPOMasterConfig
from nemo_rl_clone.utils.config import load_config_from_cli, print_config
from nemo_rl_clone.utils.config_validation import config_to_dict

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "grpo_math_1B.yaml"


def main(argv: list[str] | None = None) -> None:
    config = load_config_from_cli(GRPOMasterConfig, DEFAULT_CONFIG, argv, description="GRPO on math problems.")
    print_config(config_to_dict(config), title="GRPO config (validated)")
    print("Config is valid. The GRPO training loop is not implemented yet (see the GRPO issue); stopping here.")


if __name__ == "__main__":
    main()
