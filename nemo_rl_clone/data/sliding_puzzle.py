"""The sliding puzzle's rules and text: boards, moves, the first prompt and the answer format. The ``sliding_puzzle``
dataset deals games with them and the ``sliding_puzzle_game`` environment plays them (docs of the game:
`nemo_rl_clone.environments.games.sliding_puzzle`).

A board is ``size`` rows of tiles 1 .. size²-1 and one empty square (0); it is solved when the tiles read 1, 2, 3, …
row by row with the empty square last.
"""

from __future__ import annotations

import random
import re

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
