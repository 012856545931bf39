"""The dry run's memory plan against real runs: each worker's planned peak is within 25% of the peak resident memory
the worker measured (``memory/*_peak_rss_gb``, ``ru_maxrss`` of the worker process) for the main job's config
(2 steps, so that a refit is in it; no validation; its engine eager) and the SFT smoke config; the GRPO smoke run of test_grpo.py
checks its own through `assert_memory_plan_holds`."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
from nemo_rl_clone.algorithms.run.dry_run import Plan, plan_memory
from nemo_rl_clone.algorithms.sft import SFTMasterConfig
from nemo_rl_clone.utils.config import load_validated_config
from tests.functional.supervised_runs import REPO, read_metrics, run_dirs, run_entry_point

# On the worker of the other "memory" tests, one at a time (tests/machine_share.py): the main job's model, ~12 GB.
pytestmark = pytest.mark.xdist_group("memory")

TOLERANCE = 0.25
METRIC = {
    "policy worker": "memory/policy_worker_peak_rss_gb",
    "generation engine": "memory/generation_worker_peak_rss_gb",
}
RUNS = {
    "main_job": (
        "grpo_math",
        "grpo_smollm2_cpu.yaml",
        GRPOMasterConfig,
        [
            "grpo.max_num_steps=2",
            "grpo.val_at_start=false",
            "grpo.val_period=0",
            "checkpointing.enabled=false",
            # Eager: a compiled engine's first start compiles (~35 s more here) and its peak is the same within 1%
            # (3.62 GB compiled against 3.64 GB eager, policy worker 5.52 against 5.54 GB; 2026-11-30, 2-core AMD EPYC).
            "policy.generation.vllm_cfg.enforce_eager=true",
        ],
    ),
    "sft_smoke": ("sft", "sft_smoke.yaml", SFTMasterConfig, ["checkpointing.enabled=false"]),
}


@pytest.mark.parametrize("run", list(RUNS))
def test_planned_peak_is_within_25_percent_of_the_measured_one(run, tmp_path: Path):
    algorithm, config_name, schema, overrides = RUNS[run]
    run_entry_point(algorithm, tmp_path, *overrides, config=config_name, timeout=900, plain_workers=True)
    (log_dir,) = run_dirs(tmp_path)
    assert_memory_plan_holds(read_metrics(log_dir), config_name, overrides, schema)


def assert_memory_plan_holds(
    metrics: dict[int, dict[str, float]], config_name: str, overrides: list[str], schema: type
) -> None:
    """Each worker's planned peak (the dry run's memory plan of ``configs/{config_name}`` with ``overrides``) is within
    25% of the peak the run measured."""
    measured = metrics[max(metrics)]  # ru_maxrss: the peak since the worker started
    config = load_validated_config(REPO / "configs" / config_name, overrides, schema)
    plan = Plan()
    plan_memory(config, plan)
    algorithm_is_sft = schema is SFTMasterConfig
    assert {w.kind for w in plan.workers} == ({"policy worker"} if algorithm_is_sft else set(METRIC))
    for worker in plan.workers:
        peak_gb = measured[METRIC[worker.kind]]
        planned_gb = worker.total / 1e9
        assert abs(planned_gb - peak_gb) <= TOLERANCE * peak_gb, (config_name, worker.kind, planned_gb, peak_gb)
