"""The sliding-puzzle game: rules, turns, generated games, its data rows, and its environment actor over Ray."""

from __future__ import annotations

import random
from collections import deque

import pytest
import ray
import torch

from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.data.datasets.common import AllTaskProcessedDataset
from nemo_rl_clone.data.datasets.sliding_puzzle import load_sliding_puzzle
from nemo_rl_clone.data.interfaces import TaskDataSpec
from nemo_rl_clone.data.sliding_puzzle import (
    movable_tiles,
    parse_move,
    puzzle_prompt,
    render,
    shuffled_board,
    slide,
    solved_board,
)
from nemo_rl_clone.environments import create_env
from nemo_rl_clone.environments.config import SlidingPuzzleCfg, SlidingPuzzleEnvConfig
from nemo_rl_clone.environments.games.sliding_puzzle import play_turn
from nemo_rl_clone.models.huggingface import load_tokenizer

ONE_MOVE_LEFT = [[1, 2, 3], [4, 5, 6], [7, 0, 8]]  # slide 8 left to solve


def distance_to_solved(board: list[list[int]]) -> int:
    """Fewest moves to solve ``board`` (breadth-first search; the boards here are a few moves from solved)."""
    goal, start = str(solved_board(len(board))), board
    seen, queue = {str(start)}, deque([(start, 0)])
    while queue:
        current, depth = queue.popleft()
        if str(current) == goal:
            return depth
        for tile in movable_tiles(current):
            nxt = slide(current, tile)
            if str(nxt) not in seen:
                seen.add(str(nxt))
                queue.append((nxt, depth + 1))
    raise AssertionError("unsolvable board")


def test_board_rules() -> None:
    assert solved_board(3) == [[1, 2, 3], [4, 5, 6], [7, 8, 0]]
    assert movable_tiles(solved_board(3)) == [6, 8]
    assert movable_tiles(ONE_MOVE_LEFT) == [5, 7, 8]
    assert slide(ONE_MOVE_LEFT, 8) == solved_board(3)
    assert ONE_MOVE_LEFT == [[1, 2, 3], [4, 5, 6], [7, 0, 8]]  # slide returns a new board
    with pytest.raises(ValueError, match="tile 1 is not next to the empty square"):
        slide(ONE_MOVE_LEFT, 1)
    assert render(ONE_MOVE_LEFT) == "1 2 3\n4 5 6\n7 _ 8"
    assert render(solved_board(4)).splitlines()[0] == " 1  2  3  4"


@pytest.mark.parametrize(("size", "moves"), [(2, 1), (3, 2), (3, 4), (4, 6)])
def test_shuffled_boards_are_unsolved_and_at_most_the_shuffle_away(size: int, moves: int) -> None:
    rng = random.Random(7)
    for _ in range(20):
        board = shuffled_board(size, moves, rng)
        assert board != solved_board(size)
        assert 1 <= distance_to_solved(board) <= moves


def test_parse_move_reads_the_last_tag() -> None:
    assert parse_move("I think <move>3</move>") == 3
    assert parse_move("<move> 12 </move> no, <move>4</move>") == 4
    assert parse_move("move 3") is None
    assert parse_move("<move>three</move>") is None


def test_turns_solve_refuse_and_run_out() -> None:
    reply, board, reward, done, answer = play_turn("<move>8</move>", ONE_MOVE_LEFT, moves=0, max_moves=4)
    assert (reward, done, answer, board) == (1.0, True, "8", solved_board(3))
    assert reply == "You moved 8. Solved in 1 moves."

    reply, board, reward, done, answer = play_turn("<move>1</move>", ONE_MOVE_LEFT, moves=0, max_moves=4)
    assert (reward, done, answer, board) == (0.0, False, "1", ONE_MOVE_LEFT)
    assert reply.startswith("Tile 1 cannot move: it is not next to the empty square. The board:\n1 2 3")
    assert reply.endswith("Tiles you can move: 5, 7, 8. Your move?")

    reply, board, reward, done, answer = play_turn("the 8 goes left", ONE_MOVE_LEFT, moves=3, max_moves=4)
    assert (reward, done, answer) == (0.0, True, None)
    assert reply == "No move found: answer with <move>N</move>, N a tile next to the empty square. No moves left."

    _, board, reward, done, _ = play_turn("<move>5</move>", ONE_MOVE_LEFT, moves=0, max_moves=4)
    assert (reward, done) == (0.0, False) and board == [[1, 2, 3], [4, 0, 6], [7, 5, 8]]


def test_generated_games_are_seeded_and_validation_boards_distinct_and_held_out() -> None:
    games = load_sliding_puzzle(size=3, shuffle_moves=4, train_size=50, val_size=10, seed=3)
    again = load_sliding_puzzle(size=3, shuffle_moves=4, train_size=50, val_size=10, seed=3)
    assert games.train == again.train and games.validation == again.validation
    assert games.train is not None and games.validation is not None
    val_boards = [str(row["extra_env_info"]["board"]) for row in games.validation]
    assert len(set(val_boards)) == 10
    assert not {str(row["extra_env_info"]["board"]) for row in games.train} & set(val_boards)
    row = games.train[0]
    assert row["task_name"] == "sliding_puzzle_game" and row["extra_env_info"]["moves"] == 0
    assert row["problem"] == puzzle_prompt(row["extra_env_info"]["board"])
    other = load_sliding_puzzle(size=3, shuffle_moves=4, train_size=50, val_size=10, seed=4)
    assert other.train != games.train


def test_too_many_validation_games_for_the_board_space_fails_with_the_reason() -> None:
    # 3x3 boards two moves from solved: only 4 exist.
    with pytest.raises(DataError, match=r"only 4 distinct 3x3 boards 2 moves from solved .* val_size 6"):
        load_sliding_puzzle(size=3, shuffle_moves=2, train_size=4, val_size=6, seed=0)
    with pytest.raises(DataError, match="almost every 3x3 board 2 moves from solved is a validation board"):
        load_sliding_puzzle(size=3, shuffle_moves=2, train_size=4, val_size=4, seed=0)


def test_game_rows_become_first_turns_that_stop_after_the_move() -> None:
    tokenizer = load_tokenizer("SmolLM2-135M-Instruct")
    games = load_sliding_puzzle(size=3, shuffle_moves=2, train_size=2, val_size=1, seed=0)
    assert games.train is not None
    dataset = AllTaskProcessedDataset(
        games.train, tokenizer, TaskDataSpec(task_name="sliding_puzzle_game"), max_seq_length=512
    )
    datum = dataset[0]
    assert datum["task_name"] == "sliding_puzzle_game"
    assert datum["stop_strings"] == ["</move>"]
    assert datum["extra_env_info"] == {"board": games.train[0]["extra_env_info"]["board"], "moves": 0}
    text = tokenizer.decode(torch.cat([m["token_ids"] for m in datum["message_log"]]).tolist())
    assert text.endswith(games.train[0]["problem"] + "<|im_end|>\n<|im_start|>assistant\n")
    rerouted = AllTaskProcessedDataset(
        games.train, tokenizer, TaskDataSpec(task_name="x"), max_seq_length=512, env_name="my_game"
    )  # data.env_name routes every row to another environment; the row's own processor still builds it
    assert rerouted[0]["task_name"] == "my_game" and rerouted[0]["stop_strings"] == ["</move>"]


@pytest.mark.usefixtures("ray_local")
def test_environment_actor_plays_a_batch_of_games() -> None:
    env = create_env("sliding_puzzle_game", SlidingPuzzleEnvConfig(cfg=SlidingPuzzleCfg(max_moves=2)))
    logs = [
        [{"role": "user", "content": "board"}, {"role": "assistant", "content": text}]
        for text in ("<move>8</move>", "<move>1</move>", "hmm")
    ]
    metadata = [{"board": ONE_MOVE_LEFT, "moves": 0}, {"board": ONE_MOVE_LEFT, "moves": 1}, {"board": ONE_MOVE_LEFT}]
    result = ray.get(env.step.remote(logs, metadata))
    assert result.rewards.tolist() == [1.0, 0.0, 0.0]
    assert result.terminateds.tolist() == [True, True, False]  # solved; second move of two; first move of two
    assert [m["moves"] for m in result.metadata] == [1, 2, 1]
    assert result.metadata[0]["board"] == solved_board(3) and result.metadata[0]["solved"]
    assert [o["role"] for o in result.observations] == ["user"] * 3
    assert result.next_stop_strings == [["</move>"]] * 3
    assert result.answers == ["8", "1", None]
    _, metrics = ray.get(env.global_post_process_and_metrics.remote({"rewards": result.rewards, "turns": [1, 2, 2]}))
    assert metrics == pytest.approx({"solve_rate": 1 / 3, "mean_moves": 5 / 3})
    with pytest.raises(ray.exceptions.RayTaskError, match="sample 0: sliding-puzzle metadata needs 'board'"):
        ray.get(env.step.remote(logs[:1], [{"board": [[1, 2], [3, 3]]}]))
    ray.kill(env)
