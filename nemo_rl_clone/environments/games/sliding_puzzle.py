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

from collections.abc import Mapping, Sequence
from typing import Any

import ray
import torch

from nemo_rl_clone.data.sliding_puzzle import (
    MOVE_STOP_STRINGS,
    Board,
    movable_tiles,
    parse_move,
    render,
    slide,
    solved_board,
)
from nemo_rl_clone.environments.config import SlidingPuzzleEnvConfig, check_env_config
from nemo_rl_clone.environments.interfaces import (
    EnvironmentInterface,
    EnvironmentReturn,
    check_step_batch,
    last_assistant_text,
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
