"""The training entry points' front door, the same for every registered algorithm.

    uv run examples/run_<algorithm>.py [--config PATH] [--dry-run] [overrides ...]
        → run_algorithm_cli("<algorithm>", DEFAULT_CONFIG, argv)

Parse and validate the config once (exit 2 with one line per problem, before torch loads), print it, then
`run_training`: pre-flight, setup (its directories removed again if it fails), train, shut down. ``--dry-run``
runs `dry_run` instead (the pre-flight checks, tokenizer, data, chat template and the memory plan).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from nemo_rl_clone.algorithms import registry
from nemo_rl_clone.algorithms.run.preflight import preflight, removed_if_run_start_fails
from nemo_rl_clone.utils.config import load_run_from_cli, print_config
from nemo_rl_clone.utils.config_validation import config_to_dict
from nemo_rl_clone.utils.errors import reporting_user_errors


class _Run(Protocol):
    def shutdown(self) -> None: ...


_R = TypeVar("_R", bound=_Run)


def run_algorithm_cli(
    name: str, default_config: str | Path, argv: list[str] | None = None, description: str = ""
) -> None:
    """Validate ``--config`` (or ``default_config``) plus overrides against algorithm ``name``'s schema, print it,
    and train (``--dry-run``: check everything and print the plan instead)."""
    config: Any
    config, dry_run = load_run_from_cli(registry.config_class(name), default_config, argv, description=description)
    print_config(config_to_dict(config), title=f"{registry.title(name)} config (validated)")
    algorithm = registry.get_algorithm(name)  # heavy imports only once the config is known to be valid
    run_training(config, algorithm.setup, algorithm.train, dry_run)


def run_training(config: Any, setup: Callable[[Any], _R], train: Callable[[_R], None], dry_run: bool = False) -> None:
    """A training entry point's work: pre-flight, setup (its directories removed again if it fails), train, shut
    down; bad input anywhere ends as ``error:`` lines and exit code 2 (`reporting_user_errors`). ``dry_run``: the
    pre-flight checks and the plan of `run.dry_run` only."""
    with reporting_user_errors():
        if dry_run:
            from nemo_rl_clone.algorithms.run.dry_run import dry_run as check_and_plan

            check_and_plan(config)
            return
        preflight(config)
        from nemo_rl_clone.algorithms.run.stop import stop_on_worker_death

        with stop_on_worker_death("start-up"), removed_if_run_start_fails(config):
            run = setup(config)
        try:
            train(run)
        finally:
            run.shutdown()
