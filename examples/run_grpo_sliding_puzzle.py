"""GRPO on a multi-turn game: sliding puzzles, one move per turn.

    uv run examples/run_grpo_sliding_puzzle.py [--config configs/grpo_sliding_puzzle.yaml] [--dry-run] [overrides ...]

With no arguments it runs ``configs/grpo_sliding_puzzle.yaml`` (SmolLM2-135M-Instruct, 3x3 boards four moves from
solved, CPU, offline). Everything else is as in ``run_grpo_math.py``: the same GRPO loop; the game is the
``env.sliding_puzzle_game`` environment the data's rows are routed to.
"""

from __future__ import annotations

from pathlib import Path

from run_grpo_math import main as run_grpo  # this script's folder is first on sys.path

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "grpo_sliding_puzzle.yaml"


def main(argv: list[str] | None = None) -> None:
    run_grpo(argv, DEFAULT_CONFIG, "GRPO on sliding puzzles (multi-turn).")


if __name__ == "__main__":  # vLLM spawns engine processes: the entry point must be import-safe
    main()
