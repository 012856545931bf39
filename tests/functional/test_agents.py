"""GRPO with ``env.agent`` (docs/agents.md): a user's agent plays every episode against the engines' OpenAI-compatible
servers, and each step trains on the servers' records of its calls (tiny random model, fp32, 2 steps)."""

from __future__ import annotations

from pathlib import Path

from tests.functional.supervised_runs import read_metrics, run_entry_point
from tests.functional.test_grpo import EXACT_MISMATCH

AGENT = Path(__file__).with_name("agent_behaviours.py")


def test_agent_episodes_train_on_the_served_tokens_and_failures_end_only_their_episode(tmp_path):
    """Each 8-episode batch has an append-only two-call episode (one sample), an episode that rewrote its context
    (one sample per call, each with the episode's advantage), and episodes that raise, hang past the timeout and
    return garbage (reward 0, counted, nothing trained). The engines' logprobs of the served tokens equal the
    trainer's (fp32: token_mult_prob_error ≤ 1.0001)."""
    proc = run_entry_point(
        "grpo",
        tmp_path,
        f"env.agent.function={AGENT}:run",
        "env.agent.timeout_s=15",  # the first requests of a fresh engine take seconds
        "grpo.val_period=0",
        config="grpo_agent_smoke.yaml",
    )
    (run_dir,) = (tmp_path / "logs").iterdir()
    metrics = read_metrics(run_dir)
    for step in (1, 2):
        m = metrics[step]
        assert 1.0 <= m["train/token_mult_prob_error"] <= EXACT_MISMATCH, (step, m)
        for kind in ("exception", "malformed_result"):
            assert m[f"train/rollout/agent/{kind}_rate"] > 0, (step, kind, m)
        assert (m["train/rollout/agent/timeout_rate"] > 0) == (step == 1), (step, m)
        assert m["train/rollout/mean_turns"] > 0, (step, m)
        # failed episodes (no call) train on nothing; the others' samples all do
        assert 0 < m["train/num_valid_samples"] < 8 * m["train/rollout/agent/samples_per_episode"], (step, m)
    # A context-breaking episode trains as 2 samples: more samples than episodes. Each step has one or two; on a
    # loaded machine step 1's can outlast the timeout beside the cold engine's first requests (once in CI).
    broke = [step for step in (1, 2) if metrics[step]["train/rollout/agent/context_break_rate"] > 0]
    assert broke, metrics
    assert all(metrics[step]["train/rollout/agent/samples_per_episode"] > 1 for step in broke), metrics
    assert "OpenAI-compatible server at http://" in proc.stdout
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_1", "step_2"]
