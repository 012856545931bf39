"""Write tool-use demonstrations for SFT: the warm start that lets GRPO learn `configs/grpo_tool_use.yaml`.

    uv run examples/make_tool_use_sft_data.py [--out data/tool_use_sft.jsonl] [--num 256]

Each row is one transcript of the tool-use environment's protocol on the GRPO recipe's task (reasoning-gym products
of two two-digit numbers): the question, a calculator call, the tool's result, the answer::

    {"messages": [{"role": "user", "content": "Solve the following multiplication: 60 * 93. ..."},
                  {"role": "assistant", "content": "<tool_call>{\"name\": \"calculator\", ...}</tool_call>"},
                  {"role": "tool", "content": "5580"},
                  {"role": "assistant", "content": "<answer>5580</answer>"}]}

The questions come from other seeds than the GRPO recipe's and exclude its validation questions, so validation
accuracy after SFT and GRPO measures questions neither has seen. The user turn is the bare question:
`configs/sft_tool_use.yaml` applies the recipe's prompt file to it, as GRPO does.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import reasoning_gym

from nemo_rl_clone.data.datasets.reasoning_gym import load_reasoning_gym

TASK = "products"
TASK_KWARGS = {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2}
GRPO_SEED, GRPO_VAL_SIZE = 42, 96  # configs/grpo_tool_use.yaml's data.reasoning_gym (inherited seed and val_size)
DEMO_SEED = 1_000_003


def demonstrations(num: int) -> list[dict[str, list[dict[str, str]]]]:
    held_out = {
        row["problem"]
        for row in load_reasoning_gym(
            TASK, TASK_KWARGS, train_size=1, val_size=GRPO_VAL_SIZE, seed=GRPO_SEED
        ).validation
    }
    rows = []
    for entry in reasoning_gym.create_dataset(TASK, seed=DEMO_SEED, size=2 * num + len(held_out), **TASK_KWARGS):
        if entry["question"] in held_out:
            continue
        call = {"name": "calculator", "arguments": {"expression": entry["metadata"]["expression"]}}
        rows.append(
            {
                "messages": [
                    {"role": "user", "content": entry["question"]},
                    {"role": "assistant", "content": f"<tool_call>{json.dumps(call)}</tool_call>"},
                    {"role": "tool", "content": entry["answer"]},
                    {"role": "assistant", "content": f"<answer>{entry['answer']}</answer>"},
                ]
            }
        )
        if len(rows) == num:
            break
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/tool_use_sft.jsonl"))
    parser.add_argument("--num", type=int, default=256, help="number of transcripts")
    args = parser.parse_args(argv)
    rows = demonstrations(args.num)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} tool-use transcripts to {args.out}")


if __name__ == "__main__":
    main()
