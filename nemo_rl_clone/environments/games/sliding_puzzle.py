"""Sliding puzzle (``env.sliding_puzzle_game``): a multi-turn game, one move per turn.

A ``size`` x ``size`` board holds the tiles 1 .. size²-1 and one empty square. Each turn the model slides one tile
that is next to the empty square into it, answering ``<move>N</move>`` (N: the tile's number); the environment
replies with the new board as the next user message. The puzzle is solved when the tiles read 1, 2, 3, … row by
row with the empty square last. Reward: 1.0 on the move that solves it, else 0. An answer without a move, or with
a tile that cannot slide, costs a move and gets an explanation. The episode ends solved or after ``max_moves``.

Per-sample metadata (built by the ``sliding_puzzle`` dataset): ``{"board": [[int]] (0 = empty), "moves": int}``;
``step`` returns it with the board after the move and ``moves`` counted.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

import ray
import torch

from nemo_rl_clone.environments.config import SlidingPuzzleEnvConfig, check_env_config
from nemo_rl_clone.environments.interfaces import (
    EnvironmentInterface,
    EnvironmentReturn,
    check_step_batch,
    last_assistant_text,
)

Board = list[list[int]]
MOVE_STOP_STRINGS = ["</move>"]  # one move per turn: generation stops right after the answer tag
_MOVE = re.compile(r"<move>\s*(\d+)\s*</move>")


def solved_board(size: int) -> Board:
    return [[(r * size + c + 1) % (size * size) for c in range(size)] for r in range(size)]


def empty_square(board: Board) -> tuple[int, int]:
    for r, row in enumerate(board):
        for c, tile in enumerate(row):
            if tile == 0:
                return r, c
    raise ValueError(f"board has no empty square (0): {board}")


def movable_tiles(board: Board) -> list[int]:
    """Tiles next to the empty square, in ascending order."""
    r, c = empty_square(board)
    size = len(board)
    near = [(r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)]
    return sorted(board[y][x] for y, x in near if 0 <= y < size and 0 <= x < size)


def slide(board: Board, tile: int) -> Board:
    """The board after sliding ``tile`` into the empty square; ValueError if it is not next to it."""
    if tile not in movable_tiles(board):
        raise ValueError(f"tile {tile} is not next to the empty square")
    r, c = empty_square(board)
    new = [list(row) for row in board]
    for y, row in enumerate(board):
        for x, value in enumerate(row):
            if value == tile:
                new[y][x], new[r][c] = 0, tile
    return new


def shuffled_board(size: int, shuffle_moves: int, rng: random.Random) -> Board:
    """A board ``shuffle_moves`` random moves away from solved (never undoing the previous move), not solved."""
    board, previous = solved_board(size), -1
    moves = 0
    while moves < shuffle_moves or board == solved_board(size):
        tile = rng.choice([t for t in movable_tiles(board) if t != previous])
        board, previous, moves = slide(board, tile), tile, moves + 1
    return board


def render(board: Board) -> str:
    width = len(str(len(board) ** 2 - 1))
    return "\n".join(" ".join(str(t).rjust(width) if t else "_".rjust(width) for t in row) for row in board)


def parse_move(text: str) -> int | None:
    """The tile of the last ``<move>N</move>`` in ``text``, or None."""
    found = _MOVE.findall(text)
    return int(found[-1]) if found else None


def puzzle_prompt(board: Board) -> str:
    """The first user message of a game."""
    size = len(board)
    goal = render(solved_board(size))
    return (
        f"Solve this {size}x{size} sliding puzzle. Each turn, slide one tile that is next to the empty square (_) "
        f"into it. Answer with only your move, the tile's number, like this: <move>N</move>. The goal is:\n{goal}\n\n"
        "The board:\n"
        f"{render(board)}\n\nTiles you can move: {', '.join(map(str, movable_tiles(board)))}. Your move?"
    )


def play_turn(response: str, board: Board, moves: int, max_moves: int) -> tuple[str, Board, float, bool, str | None]:
    """One turn: (reply to the player, new board, reward, episode over, the move read as text or None)."""
    tile = parse_move(response)
    moves += 1
    if tile is None:
        reply = "No move found: answer with <move>N</move>, N a tile next to the empty square."
    elif tile not in movable_tiles(board):
        reply = f"Tile {tile} cannot move: it is not next to the empty square."
    else:
        board = slide(board, tile)
        reply = f"You moved {tile}."
    answer = None if tile is None else str(tile)
    if board == solved_board(len(board)):
        return f"{reply} Solved in {moves} moves.", board, 1.0, True, answer
    if moves >= max_moves:
        return f"{reply} No moves left.", board, 0.0, True, answer
    options = ", ".join(map(str, movable_tiles(board)))
    return (
        f"{reply} The board:\n{render(board)}\n\nTiles you can move: {options}. Your move?",
        board,
        0.0,
        False,
        answer,
    )


@ray.remote(max_restarts=-1, max_task_retries=-1)  # the game keeps no state of its own: a restart loses nothing
class SlidingPuzzleEnvironment(EnvironmentInterface):
    """Plays each sample's game one turn per `step` (the board travels in the sample's metadata)."""

    config_class = SlidingPuzzleEnvConfig

    def __init__(self, cfg: SlidingPuzzleEnvConfig):
        check_env_config("sliding_puzzle_game", cfg)
        self._max_moves = cfg.cfg.max_moves

    def step(self, message_log_batch: list[list[dict[str, Any]]], metadata: list[dict[str, Any]]) -> EnvironmentReturn:
        check_step_batch(message_log_batch, metadata)
        observations, new_metadata, rewards, dones, answers = [], [], [], [], []
        for i, (log, info) in enumerate(zip(message_log_batch, metadata, strict=True)):
            board = _board(info, i)
            reply, board, reward, done, answer = play_turn(
                last_assistant_text(log, i), board, int(info.get("moves", 0)), self._max_moves
            )
            observations.append({"role": "user", "content": reply})
            new_metadata.append({**info, "board": board, "moves": int(info.get("moves", 0)) + 1, "solved": reward > 0})
            rewards.append(reward)
            dones.append(done)
            answers.append(answer)
        return EnvironmentReturn(
            observations=observations,
            metadata=new_metadata,
            next_stop_strings=[list(MOVE_STOP_STRINGS)] * len(metadata),
            rewards=torch.tensor(rewards, dtype=torch.float32),
            terminateds=torch.tensor(dones, dtype=torch.bool),
            answers=answers,
        )

    def global_post_process_and_metrics(self, batch: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict[str, float]]:
        """Reads ``rewards`` [B] (1.0 where solved) and optional ``turns`` [B]: solve rate and moves used."""
        rewards = torch.as_tensor(batch["rewards"], dtype=torch.float32)
        metrics = {"solve_rate": float((rewards == 1.0).float().mean()) if len(rewards) else 0.0}
        if "turns" in batch:
            metrics["mean_moves"] = float(torch.as_tensor(batch["turns"], dtype=torch.float32).mean())
        return batch, metrics


def _board(info: Mapping[str, Any], sample_index: int) -> Board:
    board = info.get("board")
    if not _is_board(board):
        raise ValueError(
            f"sample {sample_index}: sliding-puzzle metadata needs 'board', a square list of rows holding each of "
            f"0 .. n²-1 once (0 = empty), got {board!r:.200}"
        )
    return [list(row) for row in board]  # type: ignore[union-attr]


def _is_board(board: Any) -> bool:
    if not isinstance(board, Sequence) or len(board) < 2:
        return False
    size = len(board)
    if not all(isinstance(row, Sequence) and len(row) == size for row in board):
        return False
    tiles = [t for row in board for t in row]
    return all(isinstance(t, int) for t in tiles) and sorted(tiles) == list(range(size * size))
