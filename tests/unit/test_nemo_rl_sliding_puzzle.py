"""NeMo-RL v0.7.0's sliding-puzzle names (``environments.games.sliding_puzzle``), which its
``run_grpo_sliding_puzzle.py`` builds its games with: the game logic on a ``game_state`` dict, one turn of the
runner, and the loader reading the script's generated (iterable) dataset."""

from __future__ import annotations

import itertools
import random

from torch.utils.data import IterableDataset

from nemo_rl_clone.data.dataloader import DrawnRows
from nemo_rl_clone.environments.games.sliding_puzzle import SlidingPuzzleGameLogic, SlidingPuzzleRunner

ONE_MOVE_LEFT = {"size": 2, "grid": [[1, 2], [0, 3]], "solution": [[1, 2], [3, 0]], "empty_pos": (1, 0)}


def test_generate_shuffles_a_solvable_board_from_python_random():
    random.seed(3)
    state = SlidingPuzzleGameLogic.generate({"size": 3, "shuffle_moves": 7})
    random.seed(3)
    assert SlidingPuzzleGameLogic.generate({"size": 3, "shuffle_moves": 7}) == state
    assert state["solution"] == [[1, 2, 3], [4, 5, 6], [7, 8, 0]]
    assert sorted(t for row in state["grid"] for t in row) == list(range(9))
    r, c = state["empty_pos"]
    assert state["grid"][r][c] == 0 and set(state["commands"]) == {"up", "down", "left", "right", "view"}
    assert SlidingPuzzleGameLogic.generate({})["size"] == 4  # NeMo-RL's default: the 15-puzzle


def test_step_moves_tiles_by_direction_or_position_and_rewards_the_solution():
    response, reward, done, state = SlidingPuzzleGameLogic.step("left", ONE_MOVE_LEFT)  # the tile right of it
    assert (response, reward, done) == ("Congratulations! You've solved the puzzle!", 1.0, True)
    assert state["grid"] == [[1, 2], [3, 0]] and state["empty_pos"] == (1, 1)
    assert ONE_MOVE_LEFT["grid"] == [[1, 2], [0, 3]]  # the given state is unchanged
    response, reward, done, state = SlidingPuzzleGameLogic.step("slide 1 1", ONE_MOVE_LEFT)
    assert (response, reward, done, state["grid"]) == (
        "Slid tile 1 into the empty space.",
        0.0,
        False,
        [[0, 2], [1, 3]],
    )
    assert SlidingPuzzleGameLogic.step("right", ONE_MOVE_LEFT)[0] == "Cannot slide right."
    assert SlidingPuzzleGameLogic.step("slide 1 2", ONE_MOVE_LEFT)[0] == "Tile must be adjacent to the empty space."
    assert SlidingPuzzleGameLogic.step("slide x y", ONE_MOVE_LEFT)[0] == "Invalid input format. Use: slide row col"
    assert SlidingPuzzleGameLogic.step("jump", ONE_MOVE_LEFT)[0].startswith("Unknown command")


def test_render_numbers_rows_and_columns():
    lines = SlidingPuzzleGameLogic.render(ONE_MOVE_LEFT).split("\n")
    assert lines[-5:] == ["  +------+", "1 | 1  2 |", "2 |    3 |", "  +------+", "     1  2 "]


def test_a_turn_reads_the_last_action_tag():
    metadata = {"game_state": ONE_MOVE_LEFT, "num_moves": 0, "max_moves": 3}
    runner = SlidingPuzzleRunner()
    said = [{"role": "assistant", "content": "<action>up</action> then <ACTION>left</ACTION>"}]
    observation, reward, done, stops, after = runner.process_turn(said, metadata)
    assert (reward, done, stops, after) == (1.0, True, ["</action>"], None)
    assert observation["role"] == "environment" and "solved" in observation["content"]
    observation, reward, done, _, after = runner.process_turn([{"role": "assistant", "content": "hmm"}], metadata)
    assert (reward, done, after) == (0.0, False, metadata) and "Invalid response format" in observation["content"]
    _, _, done, _, after = runner.process_turn(said, {**metadata, "num_moves": 3})
    assert done and after is None  # out of moves


class Counting(IterableDataset):
    def __iter__(self):
        return itertools.count()

    def __len__(self):
        return 5


def test_an_iterable_dataset_with_a_length_is_read_as_drawn():
    rows = DrawnRows(Counting())
    assert len(rows) == 5 and rows[2] == 2 and rows[0] == 0 and rows[4] == 4
