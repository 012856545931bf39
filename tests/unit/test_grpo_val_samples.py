"""``logger.num_val_samples_to_print``: GRPO prints that many validation samples (prompt, response, reward).

The end-to-end check (a real GRPO run printing them after validation) is in tests/functional/test_grpo.py.
"""

from __future__ import annotations

import torch

from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.utils.samples import print_samples, sample_rows


def _batch() -> BatchedDataDict:
    logs = [
        [
            {"role": "user", "content": f"<user>What is {i} + 1?</user>"},
            {"role": "assistant", "content": f"It is [b]{i + 1}[/b]."},
        ]
        for i in range(3)
    ]
    return BatchedDataDict(message_log=logs, idx=[10, 11, 12])


def test_sample_rows_without_advantages() -> None:
    rows = sample_rows(_batch(), torch.tensor([1.0, 0.0, 0.5]))
    assert rows[2] == {"prompt": "<user>What is 2 + 1?</user>", "response": "It is [b]3[/b].", "reward": 0.5, "idx": 12}
    with_advantages = sample_rows(_batch(), torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0.5, -0.5, 0.0]))
    assert with_advantages[0]["advantage"] == 0.5


def test_multi_turn_rows_keep_the_episode_in_order_after_the_prompt() -> None:
    log = [
        {"role": "system", "content": "S."},
        {"role": "user", "content": "Board 1."},
        {"role": "assistant", "content": "<move>3</move>"},
        {"role": "user", "content": "Board 2."},
        {"role": "assistant", "content": "<move>4</move>"},
    ]
    (row,) = sample_rows(BatchedDataDict(message_log=[log], idx=[0]), torch.tensor([1.0]))
    assert row["prompt"] == "S.Board 1."
    assert row["response"] == "<move>3</move>Board 2.<move>4</move>"


def test_print_samples_prints_prompt_response_and_reward_verbatim(capsys) -> None:
    rows = sample_rows(_batch(), torch.tensor([1.0, 0.0, 0.5]))[:2]
    print_samples(rows, "step 4: validation sample")
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "step 4: validation sample 1/2 (reward 1)",
        "  prompt: <user>What is 0 + 1?</user>",
        "  response: It is [b]1[/b].",  # rich markup in model text is not interpreted
        "step 4: validation sample 2/2 (reward 0)",
        "  prompt: <user>What is 1 + 1?</user>",
        "  response: It is [b]2[/b].",
    ]
    print_samples([], "step 4: validation sample")
    assert capsys.readouterr().out == ""
