"""PPO with a critic: generate → reward → values → GAE → logprobs → train the critic → train the actor → sync.

The actor's run is the rollout run every RL algorithm builds (`run.rollout.setup_rollout_run`: vLLM engines, data,
environments, reward scaling and shaping, validation, refit, checkpoints); PPO adds a critic — a second policy worker
group on the training workers with a scalar head read at every token (``value.reward_model_cfg.reward_model_type:
regression``) — and replaces the group baseline by GAE over the critic's values. The loop around the step is every
algorithm's (`run.loop.train_loop`).

Per step, with the token-aligned layout of the batch (``values[:, t]`` is the critic's value of the state in which
token t is generated, so GAE, the actor's loss and the critic's loss all index response tokens alike):

1. rollouts of ``num_prompts_per_step × num_generations_per_prompt`` samples; their (scaled, shaped) rewards;
2. the critic's values of every response token, at rollout time;
3. GAE (``ppo.adv_estimator``): the reward on each sample's last response token, advantages (λ_policy, whitened
   with ``normalize_advantages``) for the actor, returns (λ_value) for the critic;
4. the actor's pre-update logprobs (and the reference's, with a KL term);
5. ``ppo_epochs`` passes of the critic over the batch (`MseValueLossFn`), then — from step
   ``policy_training_start_step + 1`` on (critic warm-up before that) — ``ppo_epochs`` passes of the actor
   (`ClippedPGLossFn`, the ratio against the logprobs of 4.);
6. the engines get the actor's new weights before they next sample.

Checkpoints hold both models: ``policy/`` (the actor) and ``value/`` (the critic), and resume both.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from nemo_rl_clone.algorithms.loss.registry import build_loss
from nemo_rl_clone.algorithms.ppo.config import PPOMasterConfig, critic_section
from nemo_rl_clone.algorithms.ppo.gae import compute_advantages_and_returns, last_token_rewards
from nemo_rl_clone.algorithms.ppo.value_loss import explained_variance
from nemo_rl_clone.algorithms.run.loop import StepResult, train_loop
from nemo_rl_clone.algorithms.run.rollout import GivenParts, RolloutAlgorithm, clipped_pg_loss
from nemo_rl_clone.algorithms.run.second_model import SyncRolloutSteps, setup_with_model
from nemo_rl_clone.algorithms.run.setup import give_megatron_its_steps
from nemo_rl_clone.algorithms.run.state import save_run_checkpoint
from nemo_rl_clone.algorithms.utils import reduce_train_results
from nemo_rl_clone.contract.loss import LossFunction
from nemo_rl_clone.models.policy.lm_policy import Policy
from nemo_rl_clone.rollout.batches import build_train_batch, training_metrics
from nemo_rl_clone.rollout.run import RolloutRun
from nemo_rl_clone.utils.config_validation import as_config
from nemo_rl_clone.utils.progress import console, phase
from nemo_rl_clone.utils.samples import sample_rows
from nemo_rl_clone.utils.timer import Timer

# The critic's checkpoint folder inside step_N (the actor's is policy/).
VALUE_DIR = "value"
# Value-loss metrics that are each microbatch's share of a global mean (`MseValueLossFn`).
_VALUE_SHARES = ("loss", "vf_clipfrac", "values_mean", "returns_mean", "returns_sq_mean", "residual_sq_mean")


@dataclass
class PPOComponents:
    config: PPOMasterConfig
    run: RolloutRun[PPOMasterConfig]  # the actor's: policy, engines, data, environments, logger, checkpoints, state
    critic: Policy
    value_loss_fn: LossFunction

    def shutdown(self) -> None:
        self.critic.shutdown()
        self.run.shutdown()


def setup(config: PPOMasterConfig | Any, given: GivenParts | None = None) -> PPOComponents:
    """Build a PPO run (validated here when given as NeMo-RL's plain dict); resumes the actor and the critic from
    ``checkpointing.checkpoint_dir`` if it holds a checkpoint. ``given``: the tokenizer and datasets a NeMo-RL-style
    caller built (`ppo.nemo_rl_api.setup`)."""
    config = as_config(config, PPOMasterConfig)
    loss_fn = clipped_pg_loss(config.loss_fn, config.policy.generation)
    run, critic = setup_with_model(config, loss_fn, partial(_build_critic, config), given)
    return PPOComponents(config, run, critic, build_loss(None, "mse_value", config.value_loss_fn))


def _build_critic(config: PPOMasterConfig, run: RolloutRun[PPOMasterConfig], env_vars: dict[str, str]) -> Policy:
    """The critic on the actor's training cluster; from ``value/`` of the checkpoint the actor resumes from."""
    latest = run.checkpointer.get_latest_checkpoint_path() if run.state.step > 0 else None
    weights, optimizer = None, None
    if latest is not None:
        weights = str(latest / VALUE_DIR / "weights")
        optimizer_dir = latest / VALUE_DIR / "optimizer"
        optimizer = str(optimizer_dir) if optimizer_dir.exists() else None
    critic = critic_section(config.value)
    give_megatron_its_steps(critic, config.ppo, run.dataloader.batches_per_epoch, config.ppo.ppo_epochs)
    return Policy(
        run.clusters[0],
        critic,
        run.tokenizer,  # the critic reads the actor's token ids
        name_prefix="value",
        init_reference_model=False,
        weights_path=weights,
        optimizer_path=optimizer,
        env_vars=env_vars,
    )


def ppo_train(c: PPOComponents) -> None:
    """Run PPO steps until ``ppo.max_num_steps``, ``max_num_epochs``, the end of the data or the save deadline."""
    train_loop(PPOSteps(c))


class PPOSteps(SyncRolloutSteps):
    """PPO's step for `train_loop` (the module doc); no refit follows a step of the critic's warm-up."""

    def __init__(self, c: PPOComponents) -> None:
        super().__init__("PPO", c.run, c.config.ppo, c.config.checkpointing, c.config.watchdog)
        self.c = c

    def train_step(self, step: int, timer: Timer) -> StepResult | None:
        c, run, cfg = self.c, self.run, self.c.config
        # 1. rollouts and their rewards
        rollouts = self.source.next(step, timer)
        if rollouts is None:
            return None
        batch, rewards = rollouts.batch, rollouts.rewards
        train_data = build_train_batch(batch, torch.zeros(batch.size), run.tokenizer, run.config)

        # 2. the critic's values at rollout time
        phase(step, "values")
        with timer.time("value_inference"):
            c.critic.prepare_for_lp_inference()
            values = c.critic.score(train_data)["scores"].float()

        # 3. GAE: advantages for the actor, returns for the critic (response tokens of kept samples only)
        mask = train_data["token_mask"] * train_data["sample_mask"][:, None]
        token_rewards = last_token_rewards(rewards.float(), mask)
        advantages, returns = compute_advantages_and_returns(cfg.ppo.adv_estimator, token_rewards, values, mask)
        train_data["advantages"], train_data["returns"] = advantages.float(), returns.float()
        train_data["values"] = values

        # 4. the actor's pre-update logprobs (and the reference's with a KL term)
        phase(step, "logprobs")
        with timer.time("policy_and_reference_logprobs"):
            run.policy.prepare_for_lp_inference()
            if run.config.needs_prev_logprobs:
                train_data["prev_logprobs"] = run.policy.get_logprobs(train_data)["logprobs"]
            if run.config.needs_reference_model:
                reference = run.policy.get_reference_policy_logprobs(train_data)["reference_logprobs"]
                train_data["reference_policy_logprobs"] = reference

        # 5. the critic, then (after its warm-up) the actor, ppo_epochs passes each
        phase(step, "value training")
        with timer.time("value_training"):
            c.critic.prepare_for_training()
            value_results = [c.critic.train(train_data, c.value_loss_fn) for _ in range(cfg.ppo.ppo_epochs)]
            c.critic.finish_training()
        policy_results = []
        self.actor_trained = cfg.ppo.trains_policy(step - 1)
        if self.actor_trained:
            phase(step, "training")
            with timer.time("policy_training"):
                run.policy.prepare_for_training()
                policy_results = [run.policy.train(train_data, run.loss_fn) for _ in range(cfg.ppo.ppo_epochs)]
                run.policy.finish_training()

        metrics = _step_metrics(policy_results, value_results, train_data, rewards, batch["total_reward"], mask)
        metrics.update({f"rollout/{k}": v for k, v in rollouts.rollout_metrics.items()})
        return StepResult(
            metrics,
            valid_samples=int(train_data["sample_mask"].sum()),
            samples=sample_rows(batch, rewards, None, run.tokenizer, train_data),
            timing=rollouts.timing,
            kept=("loss", "reward", "value_loss"),
        )

    def save(self) -> Path | None:
        return save_checkpoint(self.c)

    def log_step(self, step: int, result: StepResult, timing: dict[str, float]) -> None:
        self.logger.log_metrics(timing, step, prefix="timing/train")
        m = result.metrics
        actor = f"loss {m['loss']:.4f}, " if "loss" in m else "critic warm-up, "
        console.print(
            f"step {step}: {actor}value loss {m['value_loss']:.4f}, explained variance "
            f"{m['value_explained_variance']:.3f}, reward {m['reward']:.3f}"
        )


def save_checkpoint(c: PPOComponents) -> Path | None:
    """``step_N`` with the actor (``policy/``) and the critic (``value/``), this run's config as ``config.yaml``."""
    run = c.run
    return save_run_checkpoint(
        run.checkpointer, run.policy, run.dataloader, run.state, c.config, extra_models={VALUE_DIR: c.critic}
    )


def _step_metrics(
    policy_results: list[dict[str, Any]],
    value_results: list[dict[str, Any]],
    train_data: Any,
    rewards: torch.Tensor,
    task_rewards: torch.Tensor,
    mask: torch.Tensor,
) -> dict[str, float]:
    """``train/*``: the actor's loss metrics (last epoch; absent during the critic's warm-up), the critic's as
    ``value_*`` (last epoch), the reward, accuracy and GAE statistics over response tokens."""
    metrics = training_metrics(policy_results[-1]) if policy_results else {}
    value = reduce_train_results(value_results[-1], _VALUE_SHARES)
    metrics.update(
        value_loss=value["loss"],
        value_clipfrac=value["vf_clipfrac"],
        value_mean=value["values_mean"],
        value_grad_norm=value.get("grad_norm", float("nan")),
        value_explained_variance=explained_variance(value),
        returns_mean=value["returns_mean"],
        reward=rewards.float().mean().item(),
        accuracy=(task_rewards == 1.0).float().mean().item(),
        total_num_tokens=float(train_data["input_lengths"].sum()),
        generated_tokens=float(train_data["token_mask"].sum()),
        num_valid_samples=float(train_data["sample_mask"].sum()),
    )
    valid = mask != 0
    if valid.any():
        advantages = train_data["advantages"][valid]
        metrics.update(
            {
                "advantages/mean": advantages.mean().item(),
                "advantages/max": advantages.max().item(),
                "advantages/min": advantages.min().item(),
            }
        )
    return metrics


class PPO(RolloutAlgorithm):
    name = "ppo"
    config_class = PPOMasterConfig

    def setup(self, config: PPOMasterConfig) -> PPOComponents:
        return setup(config)

    def train(self, run: PPOComponents) -> None:
        ppo_train(run)

    def trained_models(self, config: PPOMasterConfig) -> dict[str, Any]:
        return {VALUE_DIR: config.value}


ALGORITHM = PPO()
