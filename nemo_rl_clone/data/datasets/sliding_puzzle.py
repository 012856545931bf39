"""Sliding-puzzle games (``dataset_name: sliding_puzzle``), generated offline from a seed.

Each row is one game: the first user message (rules, goal, board) and the board in ``extra_env_info`` for the
``sliding_puzzle_game`` environment, which plays the following turns. Boards are ``size`` x ``size`` and
``shuffle_moves`` random moves from solved (``env.sliding_puzzle_game.cfg.game_config``). Validation games come
from their own seed and never repeat a training board.
"""

from __future__ import annotations

import random
from typing import Any

from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.data.datasets.common import LoadedDataset
from nemo_rl_clone.data.sliding_puzzle import puzzle_prompt, shuffled_board

NAME = "sliding_puzzle"
TASK_NAME = "sliding_puzzle_game"
_VAL_SEED_OFFSET = 1_000_003


def load_sliding_puzzle(
    size: int, shuffle_moves: int, train_size: int = 1000, val_size: int = 32, seed: int = 42
) -> LoadedDataset:
    """``train_size`` training and ``val_size`` validation games (distinct validation boards)."""
    if size < 2 or shuffle_moves < 1 or train_size < 1 or val_size < 0:
        raise DataError(
            f"{NAME}: need size >= 2, shuffle_moves >= 1, train_size >= 1, val_size >= 0; got {size}, "
            f"{shuffle_moves}, {train_size}, {val_size}"
        )
    val_rng, train_rng = random.Random(seed + _VAL_SEED_OFFSET), random.Random(seed)
    val_boards: list[list[list[int]]] = []
    seen: set[str] = set()
    for _ in range(200 * max(val_size, 1)):
        if len(val_boards) == val_size:
            break
        board = shuffled_board(size, shuffle_moves, val_rng)
        if str(board) not in seen:
            seen.add(str(board))
            val_boards.append(board)
    if len(val_boards) < val_size:
        raise DataError(
            f"{NAME}: only {len(val_boards)} distinct {size}x{size} boards {shuffle_moves} moves from solved were "
            f"found for val_size {val_size}; lower val_size or raise shuffle_moves"
        )
    train_boards: list[list[list[int]]] = []
    for _ in range(200 * train_size):  # training boards may repeat; they only avoid the validation boards
        if len(train_boards) == train_size:
            break
        board = shuffled_board(size, shuffle_moves, train_rng)
        if str(board) not in seen:
            train_boards.append(board)
    if len(train_boards) < train_size:
        raise DataError(
            f"{NAME}: almost every {size}x{size} board {shuffle_moves} moves from solved is a validation board; lower "
            "val_size or raise shuffle_moves"
        )

    def row(board: list[list[int]]) -> dict[str, Any]:
        return {
            "problem": puzzle_prompt(board),
            "expected_answer": "",
            "task_name": TASK_NAME,
            "extra_env_info": {"board": board, "moves": 0},
        }

    return LoadedDataset(name=NAME, train=[row(b) for b in train_boards], validation=[row(b) for b in val_boards])
