"""GRPO runs on other environments: the multi-turn sliding puzzle, and a user's own environment named only in YAML."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.functional.supervised_runs import REPO, entry_point_args, read_metrics, run_entry_point


def test_sliding_puzzle_smoke_plays_several_turns_with_exact_tokens(tmp_path: Path) -> None:
    run_entry_point("grpo_sliding_puzzle", tmp_path, config="grpo_sliding_puzzle_smoke.yaml")
    (run_dir,) = (tmp_path / "logs").iterdir()
    metrics = read_metrics(run_dir)
    for step in (1, 2):
        m = metrics[step]
        assert m["train/rollout/mean_turns"] > 1, m  # the game goes on after the first move
        # Observations are appended as tokens and never re-tokenised: the trainer scores exactly what was sampled.
        assert 1.0 <= m["train/token_mult_prob_error"] <= 1.01, m
    assert "validation/accuracy" in metrics[2]
    assert "train/rollout/env/sliding_puzzle_game/solve_rate" in metrics[1]
    samples = [json.loads(line) for line in (run_dir / "train_data_step1.jsonl").read_text().splitlines()]
    later_turns = [s for s in samples if "Tiles you can move" in s["response"]]
    assert later_turns, [s["response"] for s in samples]
    assert "<|im_start|>user\n" in later_turns[0]["response"]  # the board came back as a templated user turn


USER_ENVIRONMENT = '''
"""A user's environment: rewards answers by how close their length is to a target (a whole episode per step)."""

import json
import os
from dataclasses import dataclass

import torch

from nemo_rl_clone.environments.interfaces import EnvironmentInterface, EnvironmentReturn, last_assistant_text


@dataclass
class LengthConfig:
    target_chars: int = 40
    log_file: str = ""

    def check(self):
        return [] if self.target_chars > 0 else [("target_chars", "must be > 0")]


class LengthReward(EnvironmentInterface):
    config_class = LengthConfig

    def __init__(self, cfg):
        self.cfg = cfg

    def step(self, message_log_batch, metadata):
        texts = [last_assistant_text(log, i) for i, log in enumerate(message_log_batch)]
        target = self.cfg.target_chars
        rewards = [max(0.0, 1.0 - abs(len(text) - target) / target) for text in texts]
        with open(self.cfg.log_file, "a") as log:
            log.write(json.dumps({"pid": os.getpid(), "rewards": rewards}) + "\\n")
        n = len(texts)
        return EnvironmentReturn(
            observations=[{"role": "user", "content": ""}] * n,
            metadata=metadata,
            next_stop_strings=[None] * n,
            rewards=torch.tensor(rewards),
            terminateds=torch.ones(n, dtype=torch.bool),
            answers=[None] * n,
        )

    def global_post_process_and_metrics(self, batch):
        return batch, {}
'''


def test_users_own_environment_named_only_in_yaml(tmp_path: Path) -> None:
    package = tmp_path / "user_code" / "my_envs"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "length.py").write_text(textwrap.dedent(USER_ENVIRONMENT))
    calls = tmp_path / "calls.jsonl"
    config = tmp_path / "length_reward.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            defaults: {REPO / "configs" / "grpo_smoke.yaml"}
            data:
              env_name: length_reward  # every row goes to the environment below
            env:
              reasoning_gym: null
              length_reward:
                env_class: my_envs.length.LengthReward
                cfg:
                  target_chars: 80
                  log_file: {calls}
            """
        )
    )
    args = entry_point_args("grpo_math", tmp_path)
    args[args.index("--config") + 1] = str(config)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'user_code'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    records = [json.loads(line) for line in calls.read_text().splitlines()]
    assert all(r["pid"] != os.getpid() for r in records)  # it ran as its own actor
    # 2 training steps of 4 prompts x 2 samples, and validation of 8 problems at step 2, all scored by it.
    assert sum(len(r["rewards"]) for r in records) == 2 * 8 + 8
    (run_dir,) = (tmp_path / "logs").iterdir()
    metrics = read_metrics(run_dir)
    step_rewards = [r for record in records for r in record["rewards"]]
    assert any(0.0 < r < 1.0 for r in step_rewards)  # graded by length, unlike the built-in 0/1 scorers
    assert 0.0 <= metrics[1]["train/reward"] <= 1.0


def test_code_environment_smoke_runs_responses_in_the_sandbox(tmp_path: Path) -> None:
    run_entry_point("grpo_math", tmp_path, config="grpo_code_smoke.yaml")
    (run_dir,) = (tmp_path / "logs").iterdir()
    metrics = read_metrics(run_dir)
    for step in (1, 2):
        m = metrics[step]
        # The tiny random model writes no working code, but every response ran in a sandbox and was scored.
        assert m["train/rollout/env/code/num_samples"] == 8, m
        assert m["train/rollout/env/code/accuracy"] == 0.0
        assert m["train/rollout/env/code/verifier_crashes"] == 0.0
    assert "validation/accuracy" in metrics[2]


def test_grpo_against_a_reward_model_trained_by_run_rm(tmp_path: Path) -> None:
    """run_rm.py trains a reward model (tiny random Llama, 2 steps); GRPO is scored by it in its own actor, and every
    logged reward is the reward model's score of that sample's text."""
    rm_dir, grpo_dir = tmp_path / "rm", tmp_path / "grpo"
    rm_dir.mkdir()
    grpo_dir.mkdir()
    run_entry_point("rm", rm_dir)
    checkpoint = rm_dir / "ckpt"
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
