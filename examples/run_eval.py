"""Evaluate a model or a training checkpoint: pass@k or cons@k on math problems or a reasoning-gym task.

    uv run examples/run_eval.py [--config configs/evals/eval.yaml] [--dry-run] [overrides ...]
    uv run examples/run_eval.py generation.model_name=results/grpo/step_50 eval.save_path=samples.jsonl

``generation.model_name`` may be a Hugging Face folder, a built-in model, a hub id, or a checkpoint of any algorithm
(``<checkpoint_dir>/step_N``; DCP weights are converted to a Hugging Face folder once). Offline smoke run:
``--config configs/evals/eval_smoke.yaml``. The config is validated first (exit code 2 with one line per problem)
and printed; the summary is printed as a table, and per-sample rows go to ``eval.save_path``. A model or data
source that cannot be used (a reward-model checkpoint, an unreachable hub dataset) exits 2 with one line.
"""

from __future__ import annotations

from pathlib import Path

from nemo_rl_clone.evals.config import EvalMasterConfig
from nemo_rl_clone.utils.config import load_run_from_cli, print_config
from nemo_rl_clone.utils.config_validation import config_to_dict
from nemo_rl_clone.utils.errors import reporting_user_errors

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "evals" / "eval.yaml"


def main(argv: list[str] | None = None) -> None:
    config, dry_run = load_run_from_cli(
        EvalMasterConfig, DEFAULT_CONFIG, argv, description="Evaluate a model or checkpoint (pass@k / cons@k)."
    )
    print_config(config_to_dict(config), title="Evaluation config (validated)")

    # Heavy imports only after the config is known to be valid: a typo fails in a second, not after torch loads.
    from nemo_rl_clone.algorithms.run.preflight import preflight, removed_if_run_start_fails
    from nemo_rl_clone.evals.eval import run_evaluation

    with reporting_user_errors():  # a wrong model or data source: one `error:` line and exit 2, no traceback
        if dry_run:  # checks and the plan only (docs/preflight.md)
            from nemo_rl_clone.algorithms.run.dry_run import dry_run as check_and_plan

            check_and_plan(config)
            return
        preflight(config)
        with removed_if_run_start_fails(config):
            run_evaluation(config)


if __name__ == "__main__":  # vLLM spawns engine processes: the entry point must be import-safe
    main()
