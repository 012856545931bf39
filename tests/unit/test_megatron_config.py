"""``policy.megatron_cfg`` validation: the backend switch, refusals (one line each), cross-checks with the policy's
own keys, NeMo-RL-style recipes (docs/policy.md#choosing-a-backend). The refusals listed in
tests/unit/test_config_keys_used.py's REFUSED are checked there; these are the rest."""

from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path
from typing import Any

import pytest

from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
from nemo_rl_clone.models.policy.config import PolicyConfig
from nemo_rl_clone.models.policy.megatron.config import MegatronConfig
from nemo_rl_clone.utils.config import load_validated_config
from nemo_rl_clone.utils.config_validation import ConfigError, _dataclass_in, validate_config
from tests.unit.test_config_keys_used import INERT

REPO = Path(__file__).resolve().parents[2]
MEGATRON: dict[str, Any] = {
    "dtensor_cfg": {"enabled": False},
    "megatron_cfg": {"enabled": True},
    "optimizer": None,
    "scheduler": None,
}


def _policy(**sections: Any) -> dict[str, Any]:
    """A Megatron policy section with ``sections`` merged one level deep into megatron_cfg and the policy."""
    policy = {key: dict(value) if isinstance(value, dict) else value for key, value in MEGATRON.items()}
    for key, value in sections.items():
        if key == "megatron_cfg":
            for sub, sub_value in value.items():
                current = policy["megatron_cfg"].get(sub)
                merged = {**current, **sub_value} if isinstance(current, dict) else sub_value
                policy["megatron_cfg"][sub] = merged
        else:
            policy[key] = value
    return policy


def _problems(policy: dict[str, Any]) -> list[str]:
    try:
        validate_config(policy, PolicyConfig)
    except ConfigError as error:
        return error.problems
    return []


def test_megatron_defaults_validate():
    config = validate_config(_policy(), PolicyConfig)
    megatron = config.megatron_cfg
    assert config.optimizer is None and config.scheduler is None
    # TE-only and CUDA-stream features are off by default; precisions follow policy.precision.
    assert (
        not megatron.apply_rope_fusion and not megatron.sequence_parallel and not megatron.gradient_accumulation_fusion
    )
    assert not megatron.optimizer.use_precision_aware_optimizer
    ddp = megatron.distributed_data_parallel_config
    assert not ddp.overlap_grad_reduce and not ddp.overlap_param_gather
    assert megatron.pipeline_dtype is None and megatron.optimizer.bf16 is None and megatron.optimizer.fp16 is None
    assert megatron.converter_type is None and megatron.attention_backend == "auto" and megatron.env_vars == {}
    assert megatron.optimizer.clip_grad == config.max_grad_norm


# Validated as a PolicyConfig: the keys lack the "policy." prefix of a run's config.
@pytest.mark.parametrize(
    ("sections", "line"),
    [
        (
            {"dtensor_cfg": {"enabled": True}},
            "megatron_cfg.enabled: pick one backend: dtensor_cfg.enabled and megatron_cfg.enabled are both true",
        ),
        (
            {"megatron_cfg": {"enabled": False}},
            "dtensor_cfg.enabled: no policy backend: set dtensor_cfg.enabled=true (DTensor/FSDP2) or "
            "megatron_cfg.enabled=true (Megatron Core)",
        ),
        (
            {"megatron_cfg": {"attention_backend": "flash"}},
            "megatron_cfg.attention_backend: not supported yet: 'flash' needs Transformer Engine, and this backend builds Megatron's "
            "local (non-TE) layer spec; use one of ['auto', 'local', 'unfused']",
        ),
        (
            {"megatron_cfg": {"attention_backend": "fused"}},
            "megatron_cfg.attention_backend: not supported yet: 'fused' needs Transformer Engine, and this backend builds Megatron's "
            "local (non-TE) layer spec; use one of ['auto', 'local', 'unfused']",
        ),
        (
            {"megatron_cfg": {"optimizer": {"optimizer": "sgd"}}},
            "megatron_cfg.optimizer.use_distributed_optimizer: Megatron's distributed optimizer shards Adam only; set "
            "it to false for optimizer: sgd",
        ),
        (
            {"megatron_cfg": {"attention_backend": "sdpa"}},
            "megatron_cfg.attention_backend: must be one of ['auto', 'local', 'unfused'], got 'sdpa'",
        ),
        (
            {"megatron_cfg": {"converter_type": "GPT2LMHeadModel"}},
            "megatron_cfg.converter_type: not supported yet: 'GPT2LMHeadModel'; the converter builds "
            "['LlamaForCausalLM', 'Qwen2ForCausalLM', 'Qwen3ForCausalLM', 'Qwen3MoeForCausalLM'] (or null: the "
            "model's architectures[0])",
        ),
        (
            {"megatron_cfg": {"empty_unused_memory_level": 3}},
            "megatron_cfg.empty_unused_memory_level: must be 0, 1 or 2, got 3",
        ),
        (
            {"megatron_cfg": {"tensor_model_parallel_size": 0}},
            "megatron_cfg.tensor_model_parallel_size: must be >= 1, got 0",
        ),
        (
            {"megatron_cfg": {"pipeline_model_parallel_size": 0}},
            "megatron_cfg.pipeline_model_parallel_size: must be >= 1, got 0",
        ),
        (
            {"megatron_cfg": {"num_layers_in_first_pipeline_stage": 1}},
            "megatron_cfg.num_layers_in_first_pipeline_stage: only applies with pipeline_model_parallel_size > 1; "
            "set it to null",
        ),
        (
            {"megatron_cfg": {"pipeline_model_parallel_size": 2, "num_layers_in_last_pipeline_stage": 0}},
            "megatron_cfg.num_layers_in_last_pipeline_stage: must be >= 1, got 0",
        ),
        (
            {"megatron_cfg": {"recompute_granularity": "selective"}},
            "megatron_cfg.recompute_granularity: only applies with activation_checkpointing: true",
        ),
        (
            {"megatron_cfg": {"activation_checkpointing": True, "recompute_modules": ["mlp"]}},
            "megatron_cfg.recompute_modules: only applies with activation_checkpointing: true and "
            "recompute_granularity: selective; set it to null",
        ),
        (
            {
                "megatron_cfg": {
                    "activation_checkpointing": True,
                    "recompute_granularity": "selective",
                    "recompute_modules": ["core_attn", "moe_act"],
                }
            },
            "megatron_cfg.recompute_modules: not supported yet: 'moe_act' (MoE or MLA modules); MoE models "
            "recompute with recompute_granularity: full",
        ),
        (
            {
                "megatron_cfg": {
                    "activation_checkpointing": True,
                    "recompute_granularity": "selective",
                    "recompute_modules": ["attention"],
                }
            },
            "megatron_cfg.recompute_modules: must be from ['core_attn', 'layernorm', 'mlp'], got 'attention'",
        ),
        (
            {"precision": "float32", "megatron_cfg": {"optimizer": {"params_dtype": "bfloat16"}}},
            "megatron_cfg.optimizer.params_dtype: not supported yet: bfloat16 parameters with policy.precision=float32 "
            "(training them without fp32 main weights); set 'float32' or the precision",
        ),
        (
            {"megatron_cfg": {"optimizer": {"min_lr": 1e-3}}},
            "megatron_cfg.optimizer.min_lr: must be between 0 and optimizer.lr (5e-06), got 0.001",
        ),
        (
            {"megatron_cfg": {"optimizer": {"adam_beta2": 1.0}}},
            "megatron_cfg.optimizer.adam_beta2: must be in [0, 1), got 1.0",
        ),
        (
            {"megatron_cfg": {"scheduler": {"lr_warmup_init": 1e-3}}},
            "megatron_cfg.scheduler.lr_warmup_init: must be between 0 and optimizer.lr (5e-06), got 0.001",
        ),
        (
            {"megatron_cfg": {"scheduler": {"lr_decay_style": "WSD"}}},
            "megatron_cfg.scheduler.lr_decay_style: 'WSD' needs a WSD decay length and style, which this config "
            "has no keys for yet; use 'constant', 'linear', 'cosine' or 'inverse-square-root'",
        ),
        (
            {"megatron_cfg": {"train_iters": 0}},
            "megatron_cfg.train_iters: must be >= 1 (or null: the run's step count), got 0",
        ),
        (
            {"megatron_cfg": {"scheduler": {"lr_decay_iters": 10, "lr_warmup_iters": 10}}},
            "megatron_cfg.scheduler.lr_decay_iters: must be > lr_warmup_iters (10), got 10",
        ),
        (
            {"megatron_cfg": {"scheduler": {"end_weight_decay": 0.1}}},
            "megatron_cfg.scheduler.end_weight_decay: must equal start_weight_decay (0.01) with "
            "weight_decay_incr_style 'constant', got 0.1",
        ),
        (
            {"megatron_cfg": {"scheduler": {"weight_decay_incr_style": "linear", "end_weight_decay": 0.0}}},
            "megatron_cfg.scheduler.end_weight_decay: must be >= start_weight_decay (0.01): Megatron's weight-decay "
            "schedule only increases; got 0.0",
        ),
        (
            {
                "megatron_cfg": {
                    "optimizer": {"use_distributed_optimizer": False},
                    "distributed_data_parallel_config": {"overlap_param_gather": True},
                }
            },
            "megatron_cfg.distributed_data_parallel_config.overlap_param_gather: only applies with "
            "optimizer.use_distributed_optimizer: true; set it to false",
        ),
        (
            {"precision": "float32", "megatron_cfg": {"pipeline_dtype": "bfloat16"}},
            "megatron_cfg.pipeline_dtype: must equal policy.precision (float32) or be null (follow it), got bfloat16",
        ),
        (
            {"precision": "float32", "megatron_cfg": {"optimizer": {"bf16": True}}},
            "megatron_cfg.optimizer.bf16: must be false with policy.precision=float32 (or null: follow it), got true",
        ),
        (
            {"precision": "bfloat16", "megatron_cfg": {"optimizer": {"bf16": False}}},
            "megatron_cfg.optimizer.bf16: must be true with policy.precision=bfloat16 (or null: follow it), got false",
        ),
        (
            {"precision": "bfloat16", "megatron_cfg": {"optimizer": {"fp16": True}}},
            "megatron_cfg.optimizer.fp16: must be false with policy.precision=bfloat16 (or null: follow it), got true",
        ),
        (
            {"megatron_cfg": {"tensor_model_parallel_size": 2, "peft": {"enabled": True, "dropout": 0.1}}},
            "megatron_cfg.peft.dropout: not supported yet: adapter dropout with tensor_model_parallel_size > 1 (each "
            "rank would drop other entries)",
        ),
        (
            {"reward_model_cfg": {"enabled": True}, "megatron_cfg": {"peft": {"enabled": True}}},
            "megatron_cfg.peft.enabled: LoRA for reward models and critics is not supported yet",
        ),
        (
            {"reward_model_cfg": {"enabled": True}, "megatron_cfg": {"use_linear_ce_fusion_loss": True}},
            "megatron_cfg.use_linear_ce_fusion_loss: must be false: a scalar-head model has no vocabulary",
        ),
    ],
)
def test_each_problem_is_one_line(sections: dict[str, Any], line: str) -> None:
    assert _problems(_policy(**sections)) == [line]


def test_dtensor_needs_its_optimizer():
    assert _problems({"optimizer": None}) == [
        "optimizer: the DTensor backend trains with this torch optimizer; null is only for the Megatron backend "
        "(megatron_cfg.enabled=true), which builds its own"
    ]
    assert _problems({"scheduler": None}) == []  # a constant learning rate


@pytest.mark.parametrize(
    ("precision", "bf16", "fp16"),
    [("float32", None, None), ("float32", False, False), ("bfloat16", True, False), ("float16", False, True)],
)
def test_precision_flags_that_agree_validate(precision: str, bf16: bool | None, fp16: bool | None) -> None:
    optimizer = {"bf16": bf16, "fp16": fp16}
    sections = {"precision": precision, "megatron_cfg": {"pipeline_dtype": precision, "optimizer": optimizer}}
    assert _problems(_policy(**sections)) == []


def test_a_disabled_megatron_section_is_not_checked():
    """NeMo-RL's DTensor recipes carry a megatron_cfg block with TE fusions on and bf16 flags: nothing reads it."""
    nemo_rl_block = {
        "enabled": False,
        "apply_rope_fusion": True,
        "sequence_parallel": True,
        "tensor_model_parallel_size": 2,
        "optimizer": {"bf16": True, "use_precision_aware_optimizer": True},
        "distributed_data_parallel_config": {"overlap_grad_reduce": True, "overlap_param_gather": True},
    }
    assert _problems({"precision": "float32", "megatron_cfg": nemo_rl_block}) == []


# NeMo-RL v0.7.0's examples/configs/grpo_math_1B_megatron.yaml, policy part (its megatron_cfg block with the keys
# NeMo-RL's base config adds), on top of this repository's configs/grpo_math_1B.yaml.
NEMO_RL_STYLE_RECIPE = """
defaults: {base}
policy:
  make_sequence_length_divisible_by: ${{policy.megatron_cfg.tensor_model_parallel_size}}
  optimizer: null
  dtensor_cfg:
    enabled: false
  megatron_cfg:
    enabled: true
    force_reconvert_from_hf: False
    empty_unused_memory_level: 1
    activation_checkpointing: false
    recompute_granularity: "full"
    recompute_modules: null
    tensor_model_parallel_size: 1
    expert_tensor_parallel_size: 1
    expert_model_parallel_size: 1
    pipeline_model_parallel_size: 1
    num_layers_in_first_pipeline_stage: null
    num_layers_in_last_pipeline_stage: null
    context_parallel_size: 1
    pipeline_dtype: ${{policy.precision}}
    sequence_parallel: false
    freeze_moe_router: true
    moe_router_dtype: "fp64"
    moe_router_load_balancing_type: "none"
    moe_router_bias_update_rate: 0.0
    moe_permute_fusion: true
    moe_enable_deepep: false
    moe_token_dispatcher_type: "alltoall"
    moe_shared_expert_overlap: false
    apply_rope_fusion: True
    bias_activation_fusion: True
    defer_fp32_logits: False
    moe_per_layer_logging: False
    mtp_num_layers: 0
    mtp_loss_scaling_factor: 0.0
    mtp_use_repeated_layer: false
    mtp_detach_heads: false
    gradient_accumulation_fusion: false
    use_fused_weighted_squared_relu: false
    use_linear_ce_fusion_loss: false
    linear_ce_fusion_chunk_size: 256
    peft:
      enabled: false
      target_modules: []
      exclude_modules: []
      dim: 8
      alpha: 32
      dropout: 0.0
      dropout_position: "post"
      lora_A_init_method: "xavier"
      lora_B_init_method: "zero"
      a2a_experimental: false
      lora_dtype: None
    optimizer:
      optimizer: "adam"
      lr: 5.0e-6
      min_lr: 5.0e-7
      weight_decay: 0.01
      bf16: true
      fp16: false
      params_dtype: "float32"
      adam_beta1: 0.9
      adam_beta2: 0.999
      adam_eps: 1e-8
      sgd_momentum: 0.9
      use_distributed_optimizer: true
      use_precision_aware_optimizer: true
      clip_grad: ${{policy.max_grad_norm}}
      optimizer_cpu_offload: false
      optimizer_offload_fraction: 0.0
    scheduler:
      start_weight_decay: ${{policy.megatron_cfg.optimizer.weight_decay}}
      end_weight_decay: ${{policy.megatron_cfg.optimizer.weight_decay}}
      weight_decay_incr_style: "constant"
      lr_decay_style: "constant"
      lr_decay_iters: 1000
      lr_warmup_iters: 13
      lr_warmup_init: 5.0e-7
    distributed_data_parallel_config:
      grad_reduce_in_fp32: false
      overlap_grad_reduce: true
      overlap_param_gather: true
      use_custom_fsdp: false
      data_parallel_sharding_strategy: "optim_grads_params"
    fp8_cfg:
      enabled: false
      fp8: "e4m3"
      fp8_recipe: "blockwise"
      fp8_param: false
    env_vars: null
"""


def test_nemo_rl_megatron_recipe_validates_unchanged(tmp_path: Path) -> None:
    """Its TE speed options and inherited DTensor schedule validate; starting the policy says each has no effect."""
    from nemo_rl_clone.models.policy.lm_policy import _unused_settings

    recipe = tmp_path / "grpo_math_1B_megatron.yaml"
    recipe.write_text(NEMO_RL_STYLE_RECIPE.format(base=REPO / "configs" / "grpo_math_1B.yaml"))
    config = load_validated_config(recipe, [], GRPOMasterConfig)
    megatron = config.policy.megatron_cfg
    assert megatron.enabled and megatron.optimizer.bf16 and megatron.pipeline_dtype == "bfloat16"
    assert megatron.env_vars is None and megatron.peft.lora_dtype == "None"
    notes = _unused_settings(config.policy)
    assert [note.split(":")[0].split(" ")[0] for note in notes] == [
        "policy.megatron_cfg.apply_rope_fusion",
        "policy.megatron_cfg.optimizer.use_precision_aware_optimizer",
        "policy.scheduler",
    ]
    quiet_overrides = [
        "policy.scheduler=null",
        "policy.megatron_cfg.apply_rope_fusion=false",
        "policy.megatron_cfg.optimizer.use_precision_aware_optimizer=false",
    ]
    quiet = load_validated_config(recipe, quiet_overrides, GRPOMasterConfig)
    assert _unused_settings(quiet.policy) == []
    # NeMo-RL's Megatron recipes also inherit the DTensor base's optimizer and context-parallel size: accepted, named.
    inherited = load_validated_config(
        recipe,
        [
            *quiet_overrides,
            "++policy.optimizer={name: torch.optim.AdamW, kwargs: {lr: 1.0e-6}}",
            "policy.dtensor_cfg.context_parallel_size=2",
            "policy.megatron_cfg.optimizer.clip_grad=0.5",
        ],
        GRPOMasterConfig,
    )
    assert [note.split(" ")[0] for note in _unused_settings(inherited.policy)] == [
        "policy.optimizer",
        "policy.max_grad_norm",
        "policy.dtensor_cfg.context_parallel_size",
    ]
    # No clipping either way (Megatron clips only above 0): nothing to note.
    unclipped = ["policy.max_grad_norm=null", "policy.megatron_cfg.optimizer.clip_grad=0.0"]
    assert (
        _unused_settings(load_validated_config(recipe, [*quiet_overrides, *unclipped], GRPOMasterConfig).policy) == []
    )


@pytest.mark.parametrize(
    ("recipe", "precision"),
    [
        ("grpo_math_1B_megatron.yaml", "bfloat16"),
        ("grpo_smoke_megatron.yaml", "float32"),
    ],
)
def test_megatron_recipes_switch_backends(recipe: str, precision: str) -> None:
    config = load_validated_config(REPO / "configs" / recipe, [], GRPOMasterConfig)
    policy = config.policy
    assert policy.megatron_cfg.enabled and not policy.dtensor_cfg.enabled and policy.precision == precision
    assert policy.optimizer is None and policy.scheduler is None


def test_grpo_recipes_warm_up_like_their_dtensor_twins() -> None:
    """lr = lr_warmup_init → optimizer.lr over lr_warmup_iters, as the DTensor recipe's LinearLR start_factor."""
    for megatron_recipe, dtensor_recipe in [
        ("grpo_math_1B_megatron.yaml", "grpo_math_1B.yaml"),
        ("grpo_smoke_megatron.yaml", "grpo_smoke.yaml"),
    ]:
        megatron = load_validated_config(REPO / "configs" / megatron_recipe, [], GRPOMasterConfig).policy
        dtensor = load_validated_config(REPO / "configs" / dtensor_recipe, [], GRPOMasterConfig).policy
        assert dtensor.optimizer is not None and dtensor.scheduler is not None
        lr = dtensor.optimizer.kwargs["lr"]
        warmup = dtensor.scheduler[0]["kwargs"]
        optimizer, scheduler = megatron.megatron_cfg.optimizer, megatron.megatron_cfg.scheduler
        assert optimizer.lr == pytest.approx(lr)
        assert scheduler.lr_warmup_init == pytest.approx(lr * warmup["start_factor"])
        assert scheduler.lr_warmup_iters == warmup["total_iters"]
        assert scheduler.lr_decay_style == "constant"


def _megatron_keys(schema: type = MegatronConfig, prefix: str = "") -> list[tuple[str, type, str]]:
    keys = []
    hints = typing.get_type_hints(schema)
    for field in dataclasses.fields(schema):
        inner = _dataclass_in(hints[field.name])
        if inner is not None:
            keys += _megatron_keys(inner, f"{prefix}{field.name}.")
        else:
            keys.append((f"{prefix}{field.name}", schema, field.name))
    return keys


def test_docs_table_lists_every_megatron_key():
    docs = (REPO / "docs" / "policy.md").read_text()
    missing = [key for key, _, _ in _megatron_keys() if f"`{key}`" not in docs]
    assert not missing, f"docs/policy.md's megatron_cfg table lacks {missing}"


@pytest.mark.parametrize("key", [key for key, owner, name in _megatron_keys() if (owner, name) in INERT])
def test_inert_keys_accept_other_values(key: str) -> None:
    """MoE keys (and the fused-loss chunk size) validate at NeMo-RL's other values: they are never refused."""
    values = {str: "other", int: 7, float: 0.5, bool: True}
    tp = typing.get_type_hints(MegatronConfig)[key]
    value = next(v for t, v in values.items() if t in (tp, *typing.get_args(tp)))
    assert _problems(_policy(megatron_cfg={key: value})) == []


def test_preflight_checks_megatron_parallel_sizes_and_skips_the_torch_optimizer():
    from nemo_rl_clone.algorithms.run.preflight import _policy_problems

    overrides = ["policy.megatron_cfg.tensor_model_parallel_size=2", "cluster.gpus_per_node=1"]
    config = load_validated_config(REPO / "configs" / "grpo_smoke_megatron.yaml", overrides, GRPOMasterConfig)
    assert _policy_problems(config, config.policy) == [
        "policy.megatron_cfg.tensor_model_parallel_size * pipeline_model_parallel_size: 2 must divide the 1 workers "
        "of cluster.*"
    ]
    config = load_validated_config(REPO / "configs" / "grpo_smoke_megatron.yaml", [], GRPOMasterConfig)
    assert _policy_problems(config, config.policy) == []
    # Context-parallel ranks hold the same samples as tensor-parallel ones: TP × CP counts against the workers.
    cp = ["policy.megatron_cfg.context_parallel_size=2", "policy.sequence_packing.enabled=true"]
    cp += ["policy.dynamic_batching.enabled=false", "cluster.gpus_per_node=2"]
    config = load_validated_config(REPO / "configs" / "grpo_smoke_megatron.yaml", overrides + cp, GRPOMasterConfig)
    assert _policy_problems(config, config.policy) == [
        "policy.megatron_cfg.tensor_model_parallel_size * context_parallel_size * pipeline_model_parallel_size: 4 "
        "must divide the 2 workers of cluster.*"
    ]


def test_supervised_data_parallel_size_counts_megatron_tp_and_pp():
    """8 workers, TP=2 × PP=2: 2 data-parallel ranks, so a global batch of 4 validates; with TP=PP=1 it does not."""
    from nemo_rl_clone.algorithms.sft import SFTMasterConfig

    recipe = REPO / "configs" / "sft_smoke_megatron.yaml"
    model_parallel = [
        "policy.megatron_cfg.tensor_model_parallel_size=2",
        "policy.megatron_cfg.pipeline_model_parallel_size=2",
    ]
    config = load_validated_config(recipe, ["cluster.gpus_per_node=8", *model_parallel], SFTMasterConfig)
    assert config.policy.model_parallel_size() == 4
    with pytest.raises(ConfigError) as err:
        load_validated_config(recipe, ["cluster.gpus_per_node=8"], SFTMasterConfig)
    assert err.value.problems == [
        "policy.train_global_batch_size: must be a multiple of the data-parallel size 8 (got 4)",
        "sft.val_global_batch_size: must be a multiple of the data-parallel size 8 (got 4)",
    ]


def test_the_schedule_sets_the_weight_decay_as_in_megatron():
    """NeMo-RL's PPO value model overrides ``optimizer.weight_decay`` (0.01) and keeps its schedule's 0.1: it
    validates, and the decay that acts from the first step is the schedule's, as Megatron's scheduler sets it."""
    import torch

    from nemo_rl_clone.models.policy.megatron.model import build_scheduler

    policy = _policy(
        megatron_cfg={
            "optimizer": {"weight_decay": 0.01},
            "scheduler": {"start_weight_decay": 0.1, "end_weight_decay": 0.1, "weight_decay_incr_style": "constant"},
        }
    )
    megatron = validate_config(policy, PolicyConfig).megatron_cfg
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], weight_decay=megatron.optimizer.weight_decay)
    build_scheduler(optimizer, megatron)
    assert optimizer.param_groups[0]["weight_decay"] == 0.1


def _stepped_schedule(steps: int, **megatron_cfg: Any) -> tuple[Any, Any]:
    """(optimizer, scheduler) built from a policy section with ``megatron_cfg``, after ``steps`` steps."""
    import torch

    from nemo_rl_clone.models.policy.megatron.model import build_scheduler

    megatron = validate_config(_policy(megatron_cfg=megatron_cfg), PolicyConfig).megatron_cfg
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    scheduler = build_scheduler(optimizer, megatron)
    scheduler.step(increment=steps)
    return optimizer, scheduler


def test_train_iters_spans_the_lr_decay_and_the_weight_decay_ramp_as_in_megatron():
    """Megatron decays the LR over ``lr_decay_iters`` or, when null, ``train_iters``, and ramps the weight decay over
    ``train_iters`` (not over the LR's decay): the values at a few steps against the formulas, by hand."""
    lr, min_lr, warmup, train_iters = 1e-3, 1e-4, 2, 10
    schedule = {
        "train_iters": train_iters,
        "optimizer": {"lr": lr, "min_lr": min_lr},
        "scheduler": {
            "lr_warmup_iters": warmup,
            "lr_warmup_init": 0.0,
            "lr_decay_style": "cosine",
            "lr_decay_iters": None,
            "weight_decay_incr_style": "linear",
            "start_weight_decay": 0.0,
            "end_weight_decay": 0.1,
        },
    }
    for step in (1, 4, 7, 10):
        optimizer, _ = _stepped_schedule(step, **schedule)
        group = optimizer.param_groups[0]
        if step <= warmup:
            expected_lr = lr * step / warmup
        else:
            expected_lr = min_lr + 0.5 * (lr - min_lr) * (
                1 + math.cos(math.pi * (step - warmup) / (train_iters - warmup))
            )
        assert group["lr"] == pytest.approx(expected_lr, rel=1e-12), step
        assert group["weight_decay"] == pytest.approx(0.1 * step / train_iters, rel=1e-12), step
    # the weight decay still ramps over train_iters when the LR decays over its own lr_decay_iters
    schedule["scheduler"] = {**schedule["scheduler"], "lr_decay_iters": 5}
    optimizer, _ = _stepped_schedule(4, **schedule)
    assert optimizer.param_groups[0]["weight_decay"] == pytest.approx(0.1 * 4 / train_iters, rel=1e-12)


def test_a_resumed_schedule_keeps_the_checkpoints_values_unless_overridden():
    """Without ``override_opt_param_scheduler`` a resume keeps the saved LR and says which config values it did not
    take; with it the config's LR acts from the saved step on. Either way the step count is the checkpoint's."""
    from nemo_rl_clone.models.policy.megatron.optimizer_checkpoint import load_schedule

    constant = {"lr_warmup_iters": 0, "lr_decay_style": "constant"}
    _, saved = _stepped_schedule(3, optimizer={"lr": 1e-5, "min_lr": 0.0}, scheduler=constant)
    state = saved.state_dict()

    optimizer, kept = _stepped_schedule(0, optimizer={"lr": 2e-5, "min_lr": 0.0}, scheduler=constant)
    notice = load_schedule(kept, state)
    assert kept.num_steps == 3 and optimizer.param_groups[0]["lr"] == 1e-5
    assert notice == (
        "Resumed LR schedule at step 3: the checkpoint's values are kept where the config differs "
        "(policy.megatron_cfg.scheduler.override_opt_param_scheduler=true takes the config's): "
        "policy.megatron_cfg.optimizer.lr: checkpoint 1e-05, config 2e-05"
    )

    override = {**constant, "override_opt_param_scheduler": True}
    optimizer, taken = _stepped_schedule(0, optimizer={"lr": 2e-5, "min_lr": 0.0}, scheduler=override)
    notice = load_schedule(taken, state)
    assert taken.num_steps == 3 and optimizer.param_groups[0]["lr"] == 2e-5
    assert notice is not None and "the config's values replace the checkpoint's" in notice

    _, same = _stepped_schedule(0, optimizer={"lr": 1e-5, "min_lr": 0.0}, scheduler=constant)
    assert load_schedule(same, state) is None and same.num_steps == 3


def test_the_algorithms_give_megatron_the_runs_step_count():
    """NeMo-RL's rule: min(max_num_steps, max_num_epochs × batches per epoch) × train calls per step; SFT's -1 is no
    limit; a value the config sets is kept; a DTensor policy is left alone."""
    from types import SimpleNamespace

    from nemo_rl_clone.algorithms.run.setup import give_megatron_its_steps

    def steps(max_num_steps: int, max_num_epochs: int, batches: int, calls: int = 1, **megatron_cfg: Any) -> Any:
        policy = validate_config(_policy(megatron_cfg=megatron_cfg), PolicyConfig)
        give_megatron_its_steps(
            policy, SimpleNamespace(max_num_steps=max_num_steps, max_num_epochs=max_num_epochs), batches, calls
        )
        return policy.megatron_cfg.train_iters

    assert steps(100, 2, 30) == 60
    assert steps(20, 2, 30) == 20
    assert steps(-1, 3, 7) == 21
    assert steps(5, 1, 30, calls=4) == 20
    assert steps(5, 1, 30, train_iters=1000) == 1000
    dtensor = validate_config(_policy(), PolicyConfig)
    dtensor.megatron_cfg.enabled = False  # as a DTensor policy's section is
    give_megatron_its_steps(dtensor, SimpleNamespace(max_num_steps=5, max_num_epochs=1), 30)
    assert dtensor.megatron_cfg.train_iters is None
