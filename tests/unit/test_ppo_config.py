"""The ``ppo`` and ``value_loss_fn`` sections: NeMo-RL v0.7.0's PPO recipes validate, defaults are NeMo-RL's, and
values of features not built here are refused naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_rl_clone.algorithms.ppo import GAEConfig, MseValueLossConfig, PPOConfig
from nemo_rl_clone.utils.config_validation import ConfigError, validate_config

REPO = Path(__file__).resolve().parents[2]

# The ppo section of NeMo-RL v0.7.0's examples/configs/ppo_math_1B.yaml, as its keys and values.
PPO_MATH_1B = {
    "num_prompts_per_step": 32,
    "num_generations_per_prompt": 16,
    "max_rollout_turns": 1,
    "max_num_epochs": 100000,
    "max_num_steps": 100000,
    "ppo_epochs": 4,
    "policy_training_start_step": 0,
    "val_period": 20,
    "val_at_start": True,
    "val_at_end": False,
    "overlong_filtering": False,
    "max_val_samples": 256,
    "val_batch_size": 256,
    "seed": 42,
    "use_dynamic_sampling": False,
    "dynamic_sampling_max_gen_batches": 10,
    "batch_multiplier": 1,
    "skip_reference_policy_logprobs_calculation": True,
    "reward_shaping": {
        "enabled": True,
        "overlong_buffer_length": 2048,
        "overlong_buffer_penalty": 1,
        "max_response_length": 14336,
        "stop_properly_penalty_coef": None,
    },
    "adv_estimator": {
        "name": "gae",
        "gae_lambda": 0.95,
        "gae_gamma": 1,
        "normalize_advantages": True,
        "gae_lambda_value": None,
        "gae_lambda_policy": None,
        "length_adaptive_alpha": 0.0,
    },
    "reward_scaling": {"enabled": True, "source_min": 0.0, "source_max": 1.0, "target_min": -1.0, "target_max": 1.0},
}


def ppo(**overrides) -> PPOConfig:
    section = {**PPO_MATH_1B, **overrides}
    return validate_config(section, PPOConfig)


def problems_of(section: dict, schema: type) -> list[str]:
    with pytest.raises(ConfigError) as error:
        validate_config(section, schema)
    return error.value.problems


def test_ppo_math_1b_and_the_recipes_overrides_validate():
    cfg = ppo()
    assert cfg.adv_estimator == GAEConfig(gae_gamma=1.0)
    assert cfg.reward_scaling.target_min == -1.0 and cfg.reward_shaping.max_response_length == 14336
    # recipes/llm/ppo-qwen2.5-1.5b-gsm8k-*: VAPO's λ split, overlong filtering, one generation per prompt
    recipe = ppo(
        num_prompts_per_step=1024,
        num_generations_per_prompt=1,
        max_num_epochs=15,
        ppo_epochs=1,
        val_period=1,
        overlong_filtering=True,
        reward_shaping={"enabled": False},
        adv_estimator={"gae_lambda_value": 1.0, "gae_lambda_policy": 1},
        reward_scaling={"enabled": False},
    )
    assert recipe.adv_estimator.value_lambda == 1.0 and recipe.adv_estimator.policy_lambda == 1.0
    assert recipe.adv_estimator.gae_lambda == 0.95  # the rest of the section keeps its defaults
    for section in ({"scale": 0.4, "cliprange": 0.2}, {"scale": 1.0, "cliprange": 0.5}):
        assert validate_config(section, MseValueLossConfig) == MseValueLossConfig(**section)


def test_defaults_are_nemo_rls():
    assert PPOConfig() == ppo(reward_shaping={}, reward_scaling={})
    assert GAEConfig().policy_lambda == GAEConfig().value_lambda == 0.95
    assert MseValueLossConfig() == MseValueLossConfig(scale=1.0, cliprange=None)


def test_critic_warm_up_steps():
    cfg = ppo(policy_training_start_step=2)
    assert [cfg.trains_policy(step) for step in range(4)] == [False, False, True, True]
    assert ppo().trains_policy(0)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"use_dynamic_sampling": True}, "use_dynamic_sampling: not supported yet with PPO"),
        ({"batch_multiplier": 2}, "batch_multiplier: only applies with use_dynamic_sampling"),
        ({"adv_estimator": {"name": "raw_reward"}}, "adv_estimator.name: not supported yet: 'raw_reward'"),
        ({"adv_estimator": {"gae_lambda": 1.5}}, "adv_estimator.gae_lambda: must be in [0, 1]"),
        ({"adv_estimator": {"gae_lambda_value": -0.1}}, "adv_estimator.gae_lambda_value: must be in [0, 1]"),
        ({"adv_estimator": {"length_adaptive_alpha": -1}}, "adv_estimator.length_adaptive_alpha: must be >= 0"),
        ({"adv_estimator": {"name": "grpo"}}, "adv_estimator.name: must be one of 'gae', 'raw_reward'"),
        ({"ppo_epochs": 0}, "ppo_epochs: must be >= 1"),
        ({"policy_training_start_step": -1}, "policy_training_start_step: must be >= 0"),
        (
            {"reward_shaping": {"stop_properly_penalty_coef": 1.5}},
            "reward_shaping.stop_properly_penalty_coef: must be in [0, 1] or null, got 1.5",
        ),
        ({"gae_lambda": 0.9}, "gae_lambda: unknown key (did you mean adv_estimator.gae_lambda?)"),
    ],
)
def test_refusals_name_the_key(overrides, message):
    assert any(problem.startswith(message) for problem in problems_of({**PPO_MATH_1B, **overrides}, PPOConfig)), (
        problems_of({**PPO_MATH_1B, **overrides}, PPOConfig)
    )


def test_value_loss_fn_refusals():
    assert problems_of({"scale": -1.0}, MseValueLossConfig) == ["scale: must be >= 0, got -1.0"]
    assert problems_of({"cliprange": -0.2}, MseValueLossConfig)[0].startswith("cliprange: must be >= 0 or null")
    assert problems_of({"clip_range": 0.2}, MseValueLossConfig) == ["clip_range: unknown key (did you mean cliprange?)"]


# ------------------------------------------------------------------ the whole-run schema
@pytest.mark.parametrize("name", ["ppo_smollm2_cpu.yaml", "ppo_smoke.yaml"])
def test_shipped_ppo_configs_validate_with_a_regression_critic(name):
    from nemo_rl_clone.algorithms.ppo.config import PPOMasterConfig
    from nemo_rl_clone.utils.config import load_validated_config

    config = load_validated_config(REPO / "configs" / name, [], PPOMasterConfig)
    assert config.value.reward_model_cfg.reward_model_type == "regression"
    assert config.value.model_name == config.policy.model_name  # interpolated from the actor's section
    assert config.loop is config.ppo and not config.needs_reference_model


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["value.reward_model_cfg.reward_model_type=bradley_terry"], "value.reward_model_cfg: the critic is a scalar"),
        (["value.reward_model_cfg.enabled=false"], "value.reward_model_cfg: the critic is a scalar head"),
        (["ppo.ppo_epochs=2"], "loss_fn.force_on_policy_ratio: must be false with ppo.ppo_epochs=2"),
        (["loss_fn.reference_policy_kl_penalty=0.01"], "ppo.skip_reference_policy_logprobs_calculation: needs"),
        (["value.max_total_sequence_length=64"], "value.max_total_sequence_length: must be >= policy."),
        (["ppo.num_prompts_per_step=0"], "ppo.num_prompts_per_step"),
    ],
)
def test_whole_run_refusals_name_the_key(overrides, message):
    from nemo_rl_clone.algorithms.ppo.config import PPOMasterConfig
    from nemo_rl_clone.utils.config import load_validated_config

    with pytest.raises(ConfigError) as raised:
        load_validated_config(REPO / "configs" / "ppo_smoke.yaml", overrides, PPOMasterConfig)
    assert any(message in problem for problem in raised.value.problems), raised.value.problems


def test_reward_model_training_refuses_a_regression_head():
    from nemo_rl_clone.algorithms.rm import RMMasterConfig
    from nemo_rl_clone.utils.config import load_validated_config

    with pytest.raises(ConfigError) as raised:
        load_validated_config(
            REPO / "configs" / "rm_smoke.yaml", ["policy.reward_model_cfg.reward_model_type=regression"], RMMasterConfig
        )
    assert any("must be bradley_terry for reward-model training" in p for p in raised.value.problems)


def _on_megatron(section: str) -> list[str]:
    return [
        f"+{section}.megatron_cfg.enabled=true",
        f"+{section}.dtensor_cfg.enabled=false",
        f"{section}.sequence_packing.enabled=false",
        f"{section}.optimizer=null",
        f"{section}.scheduler=null",
    ]


@pytest.mark.parametrize(
    "overrides",
    [
        _on_megatron("policy"),
        # NeMo-RL's Megatron critic (``ppo_math_1B_megatron.yaml``) leaves ``reward_model_cfg`` off: it is a value head
        # there all the same.
        [*_on_megatron("value"), "value.reward_model_cfg.enabled=false"],
        [*_on_megatron("value"), "value.reward_model_cfg.enabled=true"],
    ],
    ids=["actor", "critic_as_nemo_rl_writes_it", "critic_with_its_head_named"],
)
def test_a_megatron_actor_or_critic_validates(overrides: list[str]):
    from nemo_rl_clone.algorithms.ppo.config import PPOMasterConfig, critic_section
    from nemo_rl_clone.utils.config import load_validated_config

    config = load_validated_config(REPO / "configs" / "ppo_smoke.yaml", overrides, PPOMasterConfig)
    critic = critic_section(config.value).reward_model_cfg
    assert (critic.enabled, critic.reward_model_type) == (True, "regression")


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("value.reward_model_cfg.reward_model_type=bradley_terry", "value.reward_model_cfg"),
        # with reward_model_cfg off as in NeMo-RL's recipe: a critic all the same, which has no vocabulary to fuse
        ("+value.megatron_cfg.use_linear_ce_fusion_loss=true", "value.megatron_cfg.use_linear_ce_fusion_loss"),
    ],
)
def test_a_megatron_critic_refuses_what_a_value_head_cannot_be(override: str, key: str):
    from nemo_rl_clone.algorithms.ppo.config import PPOMasterConfig
    from nemo_rl_clone.utils.config import load_validated_config

    overrides = [*_on_megatron("value"), "value.reward_model_cfg.enabled=false", override]
    if "bradley_terry" in override:
        overrides.remove("value.reward_model_cfg.enabled=false")
    with pytest.raises(ConfigError) as raised:
        load_validated_config(REPO / "configs" / "ppo_smoke.yaml", overrides, PPOMasterConfig)
    assert [p.split(":")[0] for p in raised.value.problems] == [key]
