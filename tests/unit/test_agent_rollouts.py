"""Agent rollouts' pure parts: an episode's extra samples become rows with the episode's advantage (checked by hand),
samples too long are cut, and ``env.agent``'s config checks (docs/agents.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.rollout.agent_rollouts import EXTRA_SAMPLES, _fit, expand_agent_samples
from nemo_rl_clone.utils.config import load_validated_config
from nemo_rl_clone.utils.config_validation import ConfigError

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "examples" / "agents" / "calculator_agent.py"


def log(*lengths: int) -> list[dict]:
    return [{"role": "assistant", "token_ids": torch.arange(n), "generation_logprobs": -torch.ones(n)} for n in lengths]


def test_extra_samples_become_rows_with_their_episodes_reward_and_advantage():
    logs = [log(2), log(3), log(4)]
    extra = [[], [log(5), log(6)], []]  # episode 1 rewrote its context: 3 samples
    batch = BatchedDataDict(message_log=logs, loss_multiplier=torch.ones(3), idx=[10, 11, 12], **{EXTRA_SAMPLES: extra})
    rewards, advantages = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0.5, -1.0, 0.5])
    rows, row_rewards, row_advantages, samples = expand_agent_samples(batch, rewards, advantages, multiple_of=4)
    assert samples == 5 and rows.size == 8  # padded to two global batches of 4
    assert [len(m[0]["token_ids"]) for m in rows["message_log"][:5]] == [2, 3, 5, 6, 4]
    assert rows["idx"][:5] == [10, 11, 11, 11, 12]
    assert row_rewards[:5].tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert row_advantages[:5].tolist() == [0.5, -1.0, -1.0, -1.0, 0.5]
    assert rows["loss_multiplier"].tolist() == [1, 1, 1, 1, 1, 0, 0, 0]  # the padding trains on nothing


def test_a_batch_without_extra_samples_is_unchanged():
    batch = BatchedDataDict(message_log=[log(2)], loss_multiplier=torch.ones(1), **{EXTRA_SAMPLES: [[]]})
    rewards = advantages = torch.zeros(1)
    assert expand_agent_samples(batch, rewards, advantages, multiple_of=8) == (batch, rewards, advantages, 1)


def test_a_sample_longer_than_the_sequence_limit_is_cut_and_marked():
    cut, truncated = _fit(log(3, 4, 5), max_seq_len=5)
    assert truncated and [len(m["token_ids"]) for m in cut] == [3, 2] and len(cut[1]["generation_logprobs"]) == 2
    whole, truncated = _fit(log(3, 2), max_seq_len=5)
    assert not truncated and [len(m["token_ids"]) for m in whole] == [3, 2]


def agent_config(*overrides: str) -> GRPOMasterConfig:
    return load_validated_config(
        REPO / "configs" / "grpo_agent_smoke.yaml", [f"env.agent.function={AGENT}:run", *overrides], GRPOMasterConfig
    )


def test_the_agent_smoke_config_validates_with_an_absolute_agent_path():
    config = agent_config()
    assert config.env["agent"].function == f"{AGENT}:run"
    relative = agent_config("env.agent.function=examples/agents/calculator_agent.py:run")
    assert relative.env["agent"].function == f"{Path.cwd() / 'examples/agents/calculator_agent.py'}:run"


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("policy.generation.vllm_cfg.expose_http_server=false", "policy.generation.vllm_cfg.expose_http_server: must"),
        ("loss_fn.force_on_policy_ratio=true", "loss_fn.force_on_policy_ratio: must be false with env.agent"),
        ("env.math={}", "env.math: an agent run's episodes are all the agent's"),
        (f"env.agent.function={AGENT}:missing", f"env.agent.function: {AGENT} has no 'missing'"),
        ("env.agent.function=no_such_file.py:run", "env.agent.function: cannot import"),
        ("env.agent.concurrency_per_engine=0", "env.agent.concurrency_per_engine: must be >= 1"),
    ],
)
def test_agent_config_problems_name_their_key(override: str, line: str):
    with pytest.raises(ConfigError) as raised:
        agent_config(override)
    assert any(problem.startswith(line) for problem in raised.value.problems), raised.value.problems


def test_ppo_refuses_an_agent_environment():
    from nemo_rl_clone.algorithms.ppo.config import PPOMasterConfig

    with pytest.raises(ConfigError) as raised:
        load_validated_config(
            REPO / "configs" / "ppo_smoke.yaml", [f"+env.agent.function={AGENT}:run"], PPOMasterConfig
        )
    assert "env.agent: not supported yet with PPO; agent runs use examples/run_grpo.py" in raised.value.problems
