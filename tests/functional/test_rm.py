"""Reward-model training end to end on CPU (real Ray, FSDP2, `datasets`): `configs/rm_smoke.yaml` through
`examples/run_rm.py`.

A tiny random model with a fresh scalar head learns 4 fixed preference pairs (generic chosen/rejected JSONL), all 4
in every step; validation on the same pairs measures its accuracy before and after. The run is cut after 4 steps
and resumed to 6. Then GRPO is scored by the reward model that run trained (`env.reward_model`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.functional.supervised_runs import (
    assert_trains_alike,
    pair_overrides,
    read_metrics,
    run_cut_and_resumed,
    run_entry_point,
)


@pytest.fixture(scope="module")
def trained(module_tmp_path: Path) -> tuple[Path, dict[int, dict[str, float]]]:
    """The reward-model run (4 steps, cut, resumed to 6): its workdir and its metrics merged per step."""
    pairs = pair_overrides(module_tmp_path, "rm")
    return module_tmp_path / "run", run_cut_and_resumed("rm", module_tmp_path / "run", *pairs)


@pytest.mark.slow
def test_reward_model_learns_the_pairs_and_resumes(trained, tmp_path):
    pairs = pair_overrides(tmp_path, "rm")
    _, metrics = trained
    for step in range(1, 7):
        for key in (
            "loss",
            "accuracy",
            "rewards_chosen_mean",
            "rewards_rejected_mean",
            "reward_margin",
            "grad_norm",
            "lr",
            "num_valid_samples",
        ):
            assert f"train/{key}" in metrics[step], (step, key, sorted(metrics[step]))
        for key in ("data_processing", "policy_training", "total_step_time"):
            assert f"timing/train/{key}" in metrics[step], (step, key)
    for step in (0, 2, 4, 6):
        assert {"validation/loss", "validation/accuracy"} <= set(metrics[step]), step
    assert metrics[6]["validation/accuracy"] == 1.0
    assert metrics[0]["validation/accuracy"] < 1.0
    assert metrics[6]["validation/loss"] < metrics[0]["validation/loss"]
    assert metrics[6]["train/reward_margin"] > metrics[1]["train/reward_margin"]
    # Packed microbatches (each pair kept whole, chosen before rejected, in one row) train as the padded ones.
    packed = assert_trains_alike("rm", tmp_path / "packed", metrics, *pairs, "policy.sequence_packing.enabled=true")
    assert {packed[step]["performance/train_padding_fraction"] for step in (1, 2, 3)} == {0.0}
    padding = [metrics[step]["performance/train_padding_fraction"] for step in (1, 2, 3)]
    assert min(padding) > 0.02, padding  # there was padding to remove, so the equality above means something


def test_grpo_against_a_reward_model_trained_by_run_rm(trained, tmp_path: Path) -> None:
    """GRPO is scored by the reward model run_rm.py trained above (tiny random Llama, 6 steps) in its own actor, and
    every logged reward is the reward model's score of that sample's text."""
    grpo_dir = tmp_path / "grpo"
    grpo_dir.mkdir()
    checkpoint = trained[0] / "ckpt"
    run_entry_point(
        "grpo_math",
        grpo_dir,
        f"env.reward_model.checkpoint_path={checkpoint}",
        config="grpo_reward_model_smoke.yaml",
    )
    (run_dir,) = (grpo_dir / "logs").iterdir()
    metrics = read_metrics(run_dir)
    for step in (1, 2):
        assert metrics[step]["train/rollout/env/reward_model/num_scored"] == 8, metrics[step]
        assert metrics[step]["train/rollout/env/reward_model/truncated"] == 0
    assert "validation/mean_reward" in metrics[2]

    # Score the logged samples again in this process with the latest step's weights: the same numbers.
    from nemo_rl_clone.environments.config import RewardModelEnvConfig
    from nemo_rl_clone.environments.reward_model_environment import RewardModelEnvironment

    scorer = RewardModelEnvironment(RewardModelEnvConfig(checkpoint_path=str(checkpoint), max_model_len=256))
    samples = [json.loads(line) for line in (run_dir / "train_data_step1.jsonl").read_text().splitlines()]
    texts = [
        scorer.conversation_text(
            [{"role": "user", "content": s["prompt"]}, {"role": "assistant", "content": s["response"]}]
        )
        for s in samples
    ]
    rescored = scorer.score_texts(texts).tolist()
    logged = [s["reward"] for s in samples]
    assert logged == pytest.approx(rescored, abs=1e-4)
    assert len({round(r, 4) for r in logged}) > 1  # graded scores, not a constant
