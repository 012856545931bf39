"""Recompute one GRPO step from its repro bundle and compare with what the run logged (docs/debugging.md).

    uv run examples/replay_step.py <log_dir>/repro/step_N

On CPU, in one process, from the weights the step started from: the trainer logprobs of the step's batch, the loss,
its metrics and the gradient norm, printed as a table of logged vs recomputed values. Rows holding a NaN or inf
(in an input such as an advantage, or in the recomputed logprobs) are named. Exit code 0 when every compared value
agrees, 1 when one does not, 2 (one ``error:`` line) on a path that is not a readable bundle.
"""

from __future__ import annotations

import argparse
import os
import sys


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bundle", help="a repro bundle folder: <log_dir>/repro/step_N")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from nemo_rl_clone.algorithms.grpo.components import replay_loss
    from nemo_rl_clone.rollout import replay
    from nemo_rl_clone.utils.errors import reporting_user_errors

    with reporting_user_errors():
        bundle = replay.load_bundle(args.bundle)
        group_size = int((bundle.config.get("grpo") or {}).get("num_generations_per_prompt", 1))
        print(f"step {bundle.step}: bundle written because {'; '.join(bundle.reasons) or 'requested'}")
        broken_inputs = replay.nonfinite_samples(bundle.batch, group_size)
        if bundle.start.get("kind") not in ("checkpoint", "initial_model"):
            print(f"not replayed: {bundle.start.get('summary', 'the weights the step started from were not saved')}")
            _print_nonfinite(broken_inputs)
            return 0
        replayed = replay.replay(bundle, replay_loss)
    print(f"replayed from {replay.describe_start(bundle)}; tolerance {replay.TOLERANCE:g} (relative above 1)")
    rows, notes = replay.comparison_rows(bundle, replayed)
    for line in replay.format_table(rows):
        print(line)
    for note in notes:
        print(f"note: {note}")
    _print_nonfinite(replay.nonfinite_samples(bundle.batch, group_size, replayed.logprobs))
    agree = all(ok for *_, ok in rows)
    print("result: " + ("recomputed values agree with the logged ones" if agree else "MISMATCH (see the table)"))
    return 0 if agree else 1


def _print_nonfinite(lines: list[str]) -> None:
    if not lines:
        print("every sample's inputs (and recomputed logprobs) are finite")
    for line in lines:
        print(f"non-finite: {line}")


if __name__ == "__main__":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # on CPU whatever the machine has; before torch is imported
    sys.exit(main())
