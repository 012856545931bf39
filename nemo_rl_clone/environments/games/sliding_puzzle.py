"""Sliding puzzle (``env.sliding_puzzle_game``): a multi-turn game, one move per turn.

A ``size`` x ``size`` board holds the tiles 1 .. size²-1 and one empty square. Each turn the model slides one tile
that is next to the empty square into it, answering ``<move>N</move>`` (N: the tile's number); the environment
replies with the new board as the next user message. The puzzle is solved when the tiles read 1, 2, 3, … row by
row with the empty square last. Reward: 1.0 on the move that solves it, else 0. An answer without a move, or with
a tile that cannot slide, costs a move and gets an explanation. The episode ends solved or after ``max_moves``.

Per-sample metadata (built by the ``sliding_puzzle`` dataset): ``{"board": [[int]] (0 = empty), "moves": int}``;
``step`` returns it with the board after the move and ``moves`` counted.

NeMo-RL's own version of the game (``SlidingPuzzleGameLogic``, ``SlidingPuzzleEnv``: ``<action>`` commands on a
``game_state`` dict) is at the end, on the same board operations.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import ray
import torch

from nemo_rl_clone.data.sliding_puzzle import (
    MOVE_STOP_STRINGS,
    Board,
    empty_square,
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


# NeMo-RL v0.7.0's dialect of the game (its examples/run_grpo_sliding_puzzle.py builds prompts and environments with
# these names): moves are ``<action>up|down|left|right|slide ROW COL|view</action>``, the board travels as a
# ``game_state`` dict, and the reward is 1.0 on the move that solves it. The board operations are the ones above.
_NEMO_RL_COMMANDS = {
    "up": "Slide tile below empty space up",
    "down": "Slide tile above empty space down",
    "left": "Slide tile to the right of empty space left",
    "right": "Slide tile to the left of empty space right",
    "view": "View the current state of the board",
}
# direction -> where the tile that moves into the empty square sits, relative to it
_DIRECTION_OFFSETS = {"up": (1, 0), "down": (-1, 0), "left": (0, 1), "right": (0, -1)}
_ACTION_STOP_STRINGS = ["</action>"]


class SlidingPuzzleConfig(TypedDict):
    size: int
    shuffle_moves: int


class SlidingPuzzleMetadata(TypedDict):
    game_state: dict[str, Any]
    num_moves: int
    max_moves: int


class SlidingPuzzleGameLogic:
    """NeMo-RL's game functions on a ``game_state`` dict (``size``, ``grid``, ``solution``, ``empty_pos``,
    ``commands``)."""

    @staticmethod
    def generate(config: Mapping[str, Any]) -> dict[str, Any]:
        """A board ``shuffle_moves`` (default 100) random moves of the empty square away from solved; ``size``
        defaults to 4. Draws from Python's `random` (the script seeds it)."""
        size, shuffle_moves = int(config.get("size", 4)), int(config.get("shuffle_moves", 100))
        board = solved_board(size)
        for _ in range(shuffle_moves):
            board = slide(board, random.choice(movable_tiles(board)))
        return {
            "size": size,
            "grid": board,
            "solution": solved_board(size),
            "empty_pos": empty_square(board),
            "commands": dict(_NEMO_RL_COMMANDS),
        }

    @staticmethod
    def init(game_state: Mapping[str, Any]) -> str:
        size = game_state["size"]
        return (
            "\n===== SLIDING PUZZLE =====\n"
            f"Arrange the {size}x{size} grid by sliding tiles into the empty space.\n"
            f"- The goal is to arrange numbers from 1 to {size * size - 1} in order\n"
            "- Use 'up', 'down', 'left', 'right' to slide in that direction\n"
            "- Use 'view' to see the current state of the board"
        )

    @staticmethod
    def step(action: str, game_state: Mapping[str, Any]) -> tuple[str, float, bool, dict[str, Any]]:
        """``(response, reward, terminated, new game_state)``; the given state is not changed. A command that
        cannot be carried out is answered and leaves the board as it was (no penalty)."""
        state = copy.deepcopy(dict(game_state))
        size, (empty_r, empty_c) = state["size"], state["empty_pos"]
        if action.startswith("slide "):
            parts = action.split()
            if len(parts) != 3 or not all(p.lstrip("-").isdigit() for p in parts[1:]):
                return "Invalid input format. Use: slide row col", 0.0, False, state
            row, col = int(parts[1]) - 1, int(parts[2]) - 1
            if not (0 <= row < size and 0 <= col < size):
                return f"Invalid position. Row/column must be between 1 and {size}.", 0.0, False, state
            if abs(row - empty_r) + abs(col - empty_c) != 1:
                return "Tile must be adjacent to the empty space.", 0.0, False, state
            tile = state["grid"][row][col]
            response = f"Slid tile {tile} into the empty space."
        elif action in _DIRECTION_OFFSETS:
            dr, dc = _DIRECTION_OFFSETS[action]
            row, col = empty_r + dr, empty_c + dc
            if not (0 <= row < size and 0 <= col < size):
                return f"Cannot slide {action}.", 0.0, False, state
            tile = state["grid"][row][col]
            response = f"Slid tile {tile} {action}."
        else:
            return "Unknown command. Type 'help' to see available commands.", 0.0, False, state
        state["grid"] = slide(state["grid"], tile)
        state["empty_pos"] = (row, col)
        if state["grid"] == state["solution"]:
            return "Congratulations! You've solved the puzzle!", 1.0, True, state
        return response, 0.0, False, state

    @staticmethod
    def render(game_state: Mapping[str, Any]) -> str:
        """The grid in a frame, rows and columns numbered from 1 (the numbers ``slide ROW COL`` takes)."""
        size = game_state["size"]
        width = len(str(size * size - 1)) + 2
        border = "  +" + "-" * width * size + "+"
        rows = [
            f"{i + 1} |" + "".join(" " * width if t == 0 else f" {t:>{width - 2}} " for t in row) + "|"
            for i, row in enumerate(game_state["grid"])
        ]
        labels = "    " + "".join(f"{c + 1:^{width}}" for c in range(size))
        return "\n".join(["\n", border, *rows, border, labels])


class SlidingPuzzleRunner:
    """One turn of NeMo-RL's game for one sample."""

    def process_turn(
        self, message_log: list[dict[str, Any]], metadata: SlidingPuzzleMetadata
    ) -> tuple[dict[str, str], float, bool, list[str] | None, SlidingPuzzleMetadata | None]:
        """``(observation, reward, terminated, next stop strings, next metadata)``; the metadata is None once the
        episode is over. After an answer without an action tag the game goes on unchanged (NeMo-RL drops the
        metadata there, so that its next turn fails on None)."""
        if metadata["num_moves"] >= metadata["max_moves"]:
            message = f"<error>Maximum moves ({metadata['max_moves']}) reached.</error>"
            return {"role": "environment", "content": message}, 0.0, True, None, None
        text = message_log[-1]["content"].strip() if message_log and message_log[-1]["role"] == "assistant" else ""
        action = _last_action(text)
        game_state = metadata["game_state"]
        next_metadata: SlidingPuzzleMetadata | None = metadata.copy()
        reward, done = 0.0, False
        if action is None:
            board = SlidingPuzzleGameLogic.render(game_state)
            content = (
                f"<environment>\n{board}\n\nInvalid response format no move made. Try <action></action> like this: "
                "<action>your_action</action></environment>"
            )
        elif action == "view":
            content = f"<environment>\n{SlidingPuzzleGameLogic.render(game_state)}\n\nViewing the board. No move made.</environment>"
        else:
            response, reward, done, new_state = SlidingPuzzleGameLogic.step(action, game_state)
            next_metadata = (
                None if done else {**metadata, "game_state": new_state, "num_moves": metadata["num_moves"] + 1}
            )
            content = f"<environment>\n{response}\n</environment>"
        return (
            {"role": "environment", "content": content + "\n"},
            reward,
            done,
            list(_ACTION_STOP_STRINGS),
            next_metadata,
        )


def _last_action(text: str) -> str | None:
    """The text inside the last ``<action>…</action>`` (tags in any case), stripped; None without one."""
    lower = text.lower()
    start = lower.rfind("<action>")
    if start == -1:
        return None
    end = lower.find("</action>", start + len("<action>"))
    return None if end == -1 else text[start + len("<action>") : end].strip()


@ray.remote
class SlidingPuzzleEnv(EnvironmentInterface):
    """NeMo-RL's sliding-puzzle environment (a Ray actor): each sample's metadata is a `SlidingPuzzleMetadata`;
    ``cfg`` may hold ``game_config`` (the script deals the games itself)."""

    def __init__(self, cfg: Mapping[str, Any] | None = None):
        self.game_config = dict(cfg.get("game_config", {})) if cfg else {}
        self.runner = SlidingPuzzleRunner()

    def step(self, message_log_batch: list[list[dict[str, Any]]], metadata: list[Any]) -> EnvironmentReturn:
        turns = [self.runner.process_turn(log, info) for log, info in zip(message_log_batch, metadata, strict=True)]
        return EnvironmentReturn(
            observations=[turn[0] for turn in turns],
            metadata=[turn[4] for turn in turns],
            next_stop_strings=[turn[3] for turn in turns],
            rewards=torch.tensor([turn[1] for turn in turns], dtype=torch.float32),
            terminateds=torch.tensor([turn[2] for turn in turns], dtype=torch.bool),
        )

    def shutdown(self) -> None:
        pass

    def global_post_process_and_metrics(self, batch: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict[str, float]]:
        """The share of episodes whose total reward is 1.0 (solved), as ``sliding_puzzle_success_rate``: NeMo-RL's
        batch holds it as ``total_reward``, this library's rollout as ``rewards``."""
        found = batch.get("total_reward", batch.get("rewards"))
        rewards = torch.as_tensor([] if found is None else found, dtype=torch.float32)
        rate = float((rewards == 1.0).float().mean()) if len(rewards) else 0.0
        return batch, {"sliding_puzzle_success_rate": rate}
