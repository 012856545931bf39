"""Loss configs: NeMo-RL's dicts work unchanged, and bad keys, values and types are refused naming the key."""

import pytest

from nemo_rl_clone.algorithms.loss import (
    ClippedPGLossConfig,
    ClippedPGLossFn,
    DPOLossConfig,
    DPOLossFn,
    LossType,
)
from tests.unit.test_loss_functions import NEMO_RL_DPO_CFG, NEMO_RL_LOSS_CFG, call, pg_loss, uniform_batch


def test_nemo_rl_config_dicts_work_unchanged():
    assert ClippedPGLossFn(NEMO_RL_LOSS_CFG).cfg == ClippedPGLossConfig()
    assert DPOLossFn(NEMO_RL_DPO_CFG).cfg == DPOLossConfig(preference_loss_weight=1, sft_loss_weight=0)
    omegaconf = pytest.importorskip("omegaconf")
    loss_fn = ClippedPGLossFn(omegaconf.OmegaConf.create({**NEMO_RL_LOSS_CFG, "ratio_clip_c": 3}))
    assert loss_fn.cfg.ratio_clip_c == 3 and loss_fn.loss_type == LossType.TOKEN_LEVEL


def test_unknown_key_names_the_nearest_valid_one():
    with pytest.raises(ValueError, match=r"ratio_clip_mx: unknown key \(did you mean ratio_clip_max\?\)"):
        ClippedPGLossFn({**NEMO_RL_LOSS_CFG, "ratio_clip_mx": 0.3})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"sequence_level_importance_ratios": True},
            "sequence_level_importance_ratios: GSPO (true) needs token_level_loss=false",
        ),
        ({"ratio_clip_c": 1.0}, "ratio_clip_c: must be > 1"),
        (
            {"use_importance_sampling_correction": True, "truncated_importance_sampling_ratio": 0.0},
            "truncated_importance_sampling_ratio: must be > 0",
        ),
        ({"truncated_importance_sampling_ratio": 2.0}, "needs use_importance_sampling_correction=true"),
        ({"ratio_clip_min": -0.1}, "ratio_clip_min: must be >= 0"),
    ],
)
def test_impossible_loss_configs_are_rejected_with_the_key(overrides, message):
    assert ClippedPGLossConfig(**overrides).check()
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ClippedPGLossFn({**NEMO_RL_LOSS_CFG, **overrides})


def test_wrong_types_are_rejected_with_the_key():
    with pytest.raises(ValueError, match="token_level_loss: expected bool, got str 'yes'"):
        ClippedPGLossFn({**NEMO_RL_LOSS_CFG, "token_level_loss": "yes"})
    with pytest.raises(TypeError, match="ClippedPGLossFn config must be a mapping or ClippedPGLossConfig"):
        ClippedPGLossFn([("ratio_clip_c", 3.0)])


def test_a_typed_config_is_used_as_loaded_without_a_second_validation():
    # The config loader validated it; the loss keeps the very object (no dict round trip).
    cfg = ClippedPGLossConfig(ratio_clip_c=3.0, token_level_loss=True)
    assert ClippedPGLossFn(cfg).cfg is cfg
    dpo = DPOLossConfig(reference_policy_kl_penalty=0.1)
    assert DPOLossFn(dpo).cfg is dpo
    assert ClippedPGLossFn(None).cfg == ClippedPGLossConfig()


@pytest.mark.parametrize("beta", [0.0, 0.01, 1.0])
def test_uses_reference_kl_is_what_the_loss_does(beta):
    """The property decides the KL term for the loss and for the run (reference model, reference logprobs)."""
    loss_fn = pg_loss(reference_policy_kl_penalty=beta)
    assert loss_fn.cfg.uses_reference_kl is (beta != 0)
    logits, data = uniform_batch([[1.0, -1.0]], ref_shift=[[0.5, -0.5]])
    _, metrics = call(loss_fn, logits, data)
    assert (metrics["kl_penalty"] != 0) is loss_fn.cfg.uses_reference_kl
    del data["reference_policy_logprobs"]
    if loss_fn.cfg.uses_reference_kl:  # only a KL term reads the reference logprobs
        with pytest.raises(KeyError, match="reference_policy_logprobs"):
            call(loss_fn, logits, data)
    else:
        call(loss_fn, logits, data)
    assert (loss_fn.rows_with_gradient(data) is None) is loss_fn.cfg.uses_reference_kl


def test_invalid_dpo_config_and_missing_data_keys():
    with pytest.raises(ValueError, match="reference_policy_kl_penalty: must be > 0"):
        DPOLossFn({**NEMO_RL_DPO_CFG, "reference_policy_kl_penalty": 0})
    logits, data = uniform_batch([[1.0]])
    del data["advantages"]
    with pytest.raises(KeyError, match=r"ClippedPGLossFn: data is missing \['advantages'\]"):
        call(pg_loss(), logits, data)
