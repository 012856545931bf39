"""Config loading, overrides, CLI and typed validation (docs/configs.md)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
from omegaconf import OmegaConf

from nemo_rl_clone.utils.config import (
    apply_overrides,
    load_config,
    load_config_from_cli,
    load_validated_config,
    parse_override_value,
    resolve_to_container,
)
from nemo_rl_clone.utils.config_validation import ConfigError, validate_config

REPO = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ---------------------------------------------------------------- defaults inheritance and resolvers


def test_defaults_string_relative_and_child_wins(tmp_path):
    write(tmp_path / "base" / "base.yaml", "a: 1\nb: {c: 2, d: 3}\n")
    child = write(tmp_path / "child.yaml", "defaults: base/base.yaml\nb: {c: 20}\n")
    cfg = load_config(child)
    assert OmegaConf.to_container(cfg) == {"a": 1, "b": {"c": 20, "d": 3}}
    assert "defaults" not in cfg


def test_defaults_list_depth_first_later_wins(tmp_path):
    write(tmp_path / "root.yaml", "x: root\ny: root\nz: root\n")
    write(tmp_path / "sub" / "mid.yaml", "defaults: ../root.yaml\ny: mid\n")
    write(tmp_path / "other.yaml", "z: other\ny: other\n")
    top = write(tmp_path / "top.yaml", "defaults: [sub/mid.yaml, other.yaml]\nx: top\n")
    cfg = OmegaConf.to_container(load_config(top))
    # mid (with root underneath) first, then other overrides y and z, then the file itself overrides x.
    assert cfg == {"x": "top", "y": "other", "z": "other"}


def test_defaults_cycle_and_missing_file(tmp_path):
    write(tmp_path / "a.yaml", "defaults: b.yaml\n")
    write(tmp_path / "b.yaml", "defaults: a.yaml\n")
    with pytest.raises(ConfigError, match=r"inheritance cycle a.yaml -> b.yaml -> a.yaml"):
        load_config(tmp_path / "a.yaml")
    write(tmp_path / "c.yaml", "defaults: nope.yaml\n")
    with pytest.raises(ConfigError, match=r"config file not found: .*nope.yaml \(named in defaults of .*c.yaml\)"):
        load_config(tmp_path / "c.yaml")


def test_a_file_loaded_before_is_read_again_once_it_or_a_default_changes(tmp_path):
    """Loads are remembered with the bytes of every file they merged: an edit of the file or of any default it
    inherits is seen at once, a defaults list that now closes a cycle is still refused, and the caller may change
    what it gets back."""
    root = write(tmp_path / "root.yaml", "x: 1\nlr: ${mul:2,3}\nsection: {_override_: true, k: 1}\n")
    mid = write(tmp_path / "mid.yaml", "defaults: root.yaml\ny: 2\n")
    top = write(tmp_path / "top.yaml", "defaults: mid.yaml\nz: 3\n")
    first = load_config(top)
    assert OmegaConf.to_container(first) == {"x": 1, "lr": "${mul:2,3}", "section": {"k": 1}, "y": 2, "z": 3}
    first.x = 100  # the caller's copy
    assert load_config(top).x == 1 and load_config(top).lr == 6
    write(root, "x: 5\n")  # a default two levels down, same length as before or not: its bytes decide
    assert OmegaConf.to_container(load_config(top)) == {"x": 5, "y": 2, "z": 3}
    write(mid, "defaults: root.yaml\ny: 7\n")
    assert load_config(top).y == 7
    write(root, "defaults: top.yaml\nx: 5\n")
    with pytest.raises(ConfigError, match=r"inheritance cycle top.yaml -> mid.yaml -> root.yaml -> top.yaml"):
        load_config(top)


def test_invalid_yaml_is_one_line(tmp_path):
    bad = write(tmp_path / "bad.yaml", "a: [1, 2\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert len(err.value.problems) == 1 and "invalid YAML" in err.value.problems[0]


def test_mul_resolver_follows_overrides(tmp_path):
    path = write(tmp_path / "c.yaml", "a: 3\nb: 4\nprod: ${mul:${a},${b}}\n")
    cfg = apply_overrides(load_config(path), ["a=5"])
    assert resolve_to_container(cfg)["prod"] == 20


# ---------------------------------------------------------------- overrides


@pytest.mark.parametrize(
    "text, expected",
    [
        ("4", 4),
        ("0.5", 0.5),
        ("1e-6", 1e-6),
        ("true", True),
        ("null", None),
        ("[1, 2]", [1, 2]),
        ("Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-1.5B"),
        ("", ""),
        ("'7'", "7"),
    ],
)
def test_override_value_parsing(text, expected):
    assert parse_override_value(text) == expected


def test_override_forms(tmp_path):
    cfg = load_config(write(tmp_path / "c.yaml", "a: {b: 1, c: 2}\n"))
    out = OmegaConf.to_container(apply_overrides(cfg, ["a.b=10", "+a.new=x", "++a.c=3", "++d.e=[1]", "~a.new"]))
    assert out == {"a": {"b": 10, "c": 3}, "d": {"e": [1]}}
    assert OmegaConf.to_container(cfg) == {"a": {"b": 1, "c": 2}}  # the input is not mutated


def test_override_errors_each_on_one_line(tmp_path):
    cfg = load_config(write(tmp_path / "c.yaml", "grpo: {num_prompts_per_step: 32}\n"))
    with pytest.raises(ConfigError) as err:
        apply_overrides(cfg, ["grpo.num_prompts_per_stpe=4", "+grpo.num_prompts_per_step=4", "~grpo.nope", "noequals"])
    problems = err.value.problems
    assert problems[0] == (
        "override 'grpo.num_prompts_per_stpe=4': grpo.num_prompts_per_stpe does not exist "
        "(did you mean grpo.num_prompts_per_step?); use +grpo.num_prompts_per_stpe=4 to add a new key"
    )
    assert "already exists; use grpo.num_prompts_per_step=4 to change it" in problems[1]
    assert "cannot delete grpo.nope: no such key" in problems[2]
    assert "expected key=value" in problems[3]
    assert len(problems) == 4


# ---------------------------------------------------------------- typed validation


@dataclass
class Inner:
    lr: float = 1e-3
    mode: Literal["a", "b"] = "a"
    names: list[str] | None = None


@dataclass
class Outer:
    steps: int
    enabled: bool = False
    inner: Inner = field(default_factory=Inner)
    extra: dict[str, Any] = field(default_factory=dict)
    batch: int = 8
    micro: int = 2

    def check(self) -> list[tuple[str, str]]:
        if self.batch % self.micro:
            return [("batch", f"must be a multiple of micro ({self.batch} % {self.micro} != 0)")]
        return []


def test_valid_config_builds_typed_objects():
    cfg = validate_config({"steps": 3, "inner": {"lr": 1, "names": ["x"]}, "extra": {"k": [1]}}, Outer)
    assert cfg == Outer(steps=3, inner=Inner(lr=1.0, names=["x"]), extra={"k": [1]})
    assert isinstance(cfg.inner.lr, float)


def test_unknown_key_suggests_nearest_full_key():
    with pytest.raises(ConfigError) as err:
        validate_config({"steps": 1, "inner": {"lrr": 0.1}}, Outer)
    assert err.value.problems == ["inner.lrr: unknown key (did you mean inner.lr?)"]


def test_unknown_key_in_wrong_section_suggests_where_it_lives():
    with pytest.raises(ConfigError) as err:
        validate_config({"steps": 1, "mode": "a"}, Outer)
    assert err.value.problems == ["mode: unknown key (did you mean inner.mode?)"]


def test_wrong_types_are_named_by_full_key():
    with pytest.raises(ConfigError) as err:
        validate_config({"steps": "3", "enabled": 1, "inner": {"lr": True, "mode": "c", "names": "x"}}, Outer)
    assert err.value.problems == [
        "steps: expected int, got str '3'",
        "enabled: expected bool, got int 1",
        "inner.lr: expected float, got bool True",
        "inner.mode: must be one of 'a', 'b', got 'c'",
        "inner.names: expected a list, got str 'x'",
    ]


def test_missing_required_key_and_section_type():
    with pytest.raises(ConfigError) as err:
        validate_config({"inner": 5}, Outer)
    assert err.value.problems == ["steps: missing required key (int)", "inner: expected a section (mapping), got int 5"]


def test_impossible_combination_uses_schema_check():
    with pytest.raises(ConfigError) as err:
        validate_config({"steps": 1, "batch": 7, "micro": 2}, Outer)
    assert err.value.problems == ["batch: must be a multiple of micro (7 % 2 != 0)"]


# ---------------------------------------------------------------- the real GRPO schema and CLI


def grpo_schema():
    from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig

    return GRPOMasterConfig


def test_grpo_math_1b_yaml_is_valid_and_resolved():
    cfg = load_validated_config(
        REPO / "configs" / "grpo_math_1B.yaml", ["policy.max_total_sequence_length=1024"], grpo_schema()
    )
    assert cfg.grpo.num_prompts_per_step == 32
    assert cfg.policy.generation.max_new_tokens == 1024  # interpolation sees the override
    assert cfg.policy.dynamic_batching.train_mb_tokens == 1024 * 4  # ${mul:...}
    assert cfg.loss_fn.ratio_clip_min == 0.2


def test_grpo_impossible_combinations():
    with pytest.raises(ConfigError) as err:
        load_validated_config(
            REPO / "configs" / "grpo_math_1B.yaml",
            [
                "policy.megatron_cfg.enabled=true",
                "policy.train_global_batch_size=102",
                "grpo.num_generations_per_prompt=1",
            ],
            grpo_schema(),
        )
    text = "\n".join(err.value.problems)
    assert (
        "policy.megatron_cfg.enabled: pick one backend: dtensor_cfg.enabled and megatron_cfg.enabled are both true"
        in text
    )
    assert "policy.train_global_batch_size: must be a multiple of train_micro_batch_size (102 % 4 != 0)" in text
    assert "grpo.use_leave_one_out_baseline: needs num_generations_per_prompt >= 2" in text


@pytest.mark.parametrize(
    ("overrides", "reference", "prev"),
    [
        ([], True, True),  # the recipe: KL 0.01, PPO ratio against the pre-update logprobs
        (["loss_fn.reference_policy_kl_penalty=0"], False, True),
        (
            ["loss_fn.reference_policy_kl_penalty=0", "++grpo.skip_reference_policy_logprobs_calculation=true"],
            False,
            True,
        ),
        (["++loss_fn.force_on_policy_ratio=true"], True, False),
        (["++loss_fn.force_on_policy_ratio=true", "++grpo.seq_logprob_error_threshold=2.0"], True, True),
    ],
    ids=["recipe", "no_kl", "no_kl_skip", "on_policy_ratio", "on_policy_ratio_with_threshold"],
)
def test_grpo_derived_switches(overrides, reference, prev):
    """The one place a run reads whether it computes reference and pre-update logprobs each step."""
    cfg = load_validated_config(REPO / "configs" / "grpo_math_1B.yaml", overrides, grpo_schema())
    assert cfg.loss_fn.uses_reference_kl is reference
    assert cfg.needs_reference_model is reference
    assert cfg.needs_prev_logprobs is prev


def test_skipping_the_reference_pass_is_refused_with_a_kl_term():
    with pytest.raises(ConfigError) as err:
        load_validated_config(
            REPO / "configs" / "grpo_math_1B.yaml",
            ["++grpo.skip_reference_policy_logprobs_calculation=true"],
            grpo_schema(),
        )
    assert (
        "grpo.skip_reference_policy_logprobs_calculation: needs loss_fn.reference_policy_kl_penalty=0: the KL term "
        "reads the reference logprobs" in err.value.problems
    )


ASYNC_CFG = REPO / "configs" / "grpo_smollm2_cpu_async.yaml"


def test_async_grpo_recipe_is_non_colocated_with_importance_sampling():
    cfg = load_validated_config(ASYNC_CFG, [], grpo_schema())
    assert cfg.grpo.async_grpo.enabled and cfg.grpo.async_grpo.max_trajectory_age_steps == 1
    assert not cfg.policy.generation.colocated.enabled
    assert cfg.loss_fn.use_importance_sampling_correction


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        (
            ["policy.generation.colocated.enabled=true"],
            "grpo.async_grpo.enabled: needs policy.generation.colocated.enabled=false: the engines generate while the "
            "trainer trains, so they need resources of their own (policy.generation.colocated.resources)",
        ),
        (
            ["loss_fn.use_importance_sampling_correction=false", "loss_fn.truncated_importance_sampling_ratio=null"],
            "loss_fn.use_importance_sampling_correction: must be true with async GRPO: it trains on rollouts of older "
            "weights, and the loss corrects for that with the engines' logprobs",
        ),
        (
            ["grpo.use_dynamic_sampling=true"],
            "grpo.use_dynamic_sampling: not supported with async GRPO (one prompt batch per step); set it to false",
        ),
        (
            ["grpo.async_grpo.max_trajectory_age_steps=0"],
            "grpo.async_grpo.max_trajectory_age_steps: must be >= 1 with async GRPO (got 0; 0 is synchronous GRPO: "
            "set async_grpo.enabled=false)",
        ),
    ],
    ids=["colocated", "no_importance_sampling", "dynamic_sampling", "age_0"],
)
def test_async_grpo_refusals(overrides, problem):
    with pytest.raises(ConfigError) as err:
        load_validated_config(ASYNC_CFG, overrides, grpo_schema())
    assert err.value.problems == [problem]


PACKING_ON = ["policy.sequence_packing.enabled=true"]


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        (
            ["policy.dtensor_cfg.attn_implementation=eager"],
            "policy.dtensor_cfg.attn_implementation: sequence packing runs SDPA attention per packed sample; set it "
            "to sdpa (got 'eager')",
        ),
        (
            ["policy.sequence_packing.train_mb_tokens=100"],
            "policy.sequence_packing.train_mb_tokens: 100 is below 512, the cost of a max_total_sequence_length "
            "sample (rounded up to sequence_length_round=64): it would fit no microbatch",
        ),
        (
            ["policy.sequence_packing.logprob_mb_tokens=0"],
            "policy.sequence_packing.logprob_mb_tokens: sequence packing needs a positive token budget per "
            "microbatch (e.g. 2048)",
        ),
        (
            ["policy.dynamic_batching.enabled=true"],
            "policy.dynamic_batching.enabled: dynamic_batching and sequence_packing cannot both be enabled",
        ),
    ],
    ids=[
        "eager_attention",
        "budget_below_max_length",
        "no_budget",
        "with_dynamic_batching",
    ],
)
def test_sequence_packing_refusals_name_the_key(overrides, problem):
    with pytest.raises(ConfigError) as err:
        load_validated_config(REPO / "configs" / "grpo_math_1B.yaml", PACKING_ON + overrides, grpo_schema())
    assert problem in err.value.problems


def test_sequence_packing_validates_on_the_dtensor_backend():
    cfg = load_validated_config(REPO / "configs" / "grpo_math_1B.yaml", PACKING_ON, grpo_schema())
    assert cfg.policy.sequence_packing.enabled and cfg.policy.sequence_packing.train_mb_tokens == 512 * 4
    tensor_parallel = ["policy.dtensor_cfg.tensor_parallel_size=2", "policy.dtensor_cfg.sequence_parallel=true"]
    cfg = load_validated_config(REPO / "configs" / "grpo_math_1B.yaml", PACKING_ON + tensor_parallel, grpo_schema())
    assert cfg.policy.sequence_packing.enabled and cfg.policy.dtensor_cfg.sequence_parallel


def test_sequence_packing_and_context_parallelism_validate_on_the_megatron_backend():
    """The DTensor backend's packing limits (no TP, SDPA) are its own: Megatron packs under TP, PP and CP."""
    megatron = [
        "policy.dtensor_cfg.enabled=false",
        "policy.megatron_cfg.enabled=true",
        "policy.optimizer=null",
        "policy.scheduler=null",
        "policy.megatron_cfg.tensor_model_parallel_size=2",
        "policy.megatron_cfg.context_parallel_size=2",
        "policy.dtensor_cfg.attn_implementation=eager",
    ]
    cfg = load_validated_config(REPO / "configs" / "grpo_math_1B.yaml", PACKING_ON + megatron, grpo_schema())
    assert cfg.policy.sequence_packing.enabled and cfg.policy.megatron_cfg.context_parallel_size == 2


LORA_ON = ["policy.dtensor_cfg.lora_cfg.enabled=true"]
_LORA = "policy.dtensor_cfg.lora_cfg"


@pytest.mark.parametrize(
    ("config", "overrides", "problem"),
    [
        (
            "grpo_math_1B_megatron.yaml",
            [],
            f"{_LORA}.enabled: dtensor_cfg.lora_cfg is the DTensor backend's LoRA; the Megatron backend has no LoRA yet",
        ),
        (
            "grpo_math_1B.yaml",
            ["policy.dtensor_cfg.tensor_parallel_size=2"],
            f"{_LORA}.enabled: LoRA with dtensor_cfg.tensor_parallel_size > 1 is not supported yet",
        ),
        (
            "grpo_math_1B.yaml",
            [f"{_LORA}.dropout=0.1"],
            f"{_LORA}.dropout_position: dropout on the adapter's output ('post') is not supported (peft drops the "
            "adapter's input); set dropout_position=pre or dropout=0.0",
        ),
        (
            "grpo_math_1B.yaml",
            [f"{_LORA}.dropout=1.0", f"{_LORA}.dropout_position=pre"],
            f"{_LORA}.dropout: must be in [0, 1), got 1.0",
        ),
        (
            "grpo_math_1B.yaml",
            [f"{_LORA}.target_modules=[q_proj]"],
            f"{_LORA}.target_modules: match_all_linear=true already targets every linear layer; set "
            "match_all_linear=false to adapt only target_modules",
        ),
        (
            "grpo_math_1B.yaml",
            [f"{_LORA}.match_all_linear=false"],
            f"{_LORA}.target_modules: name the layers to adapt (e.g. [q_proj, v_proj]), or the ones to leave out "
            "(exclude_modules), or set match_all_linear=true",
        ),
        ("grpo_math_1B.yaml", [f"{_LORA}.dim=0"], f"{_LORA}.dim: must be >= 1, got 0"),
    ],
    ids=["megatron", "tensor_parallel", "post_dropout", "dropout_range", "targets_and_all_linear", "no_targets", "dim"],
)
def test_lora_refusals_name_the_key(config, overrides, problem):
    with pytest.raises(ConfigError) as err:
        load_validated_config(REPO / "configs" / config, LORA_ON + overrides, grpo_schema())
    assert problem in err.value.problems


def test_lora_refused_for_reward_models():
    from nemo_rl_clone.algorithms.rm import RMMasterConfig

    with pytest.raises(ConfigError) as err:
        load_validated_config(REPO / "configs" / "rm.yaml", [f"++{_LORA}.enabled=true"], RMMasterConfig)
    assert (
        f"{_LORA}.enabled: LoRA for reward models (reward_model_cfg.enabled) is not supported yet" in err.value.problems
    )


def test_lora_with_pre_dropout_and_chosen_targets_validates():
    overrides = [f"{_LORA}.dropout=0.05", f"{_LORA}.dropout_position=pre", f"{_LORA}.match_all_linear=false"]
    cfg = load_validated_config(
        REPO / "configs" / "grpo_math_1B.yaml",
        [*LORA_ON, *overrides, f"{_LORA}.target_modules=[q_proj,v_proj]"],
        grpo_schema(),
    )
    assert cfg.policy.dtensor_cfg.lora_cfg.target_modules == ["q_proj", "v_proj"]
    assert cfg.policy.dtensor_cfg.lora_cfg.scaling == 32 / 8


_CP = "policy.dtensor_cfg.context_parallel_size"


@pytest.mark.parametrize(
    ("config", "overrides", "problem"),
    [
        (
            "grpo_smollm2_cpu.yaml",
            [f"{_CP}=2"],
            f"{_CP}: context parallelism with sequence_packing (use policy.dynamic_batching) is not supported yet",
        ),
        ("grpo_math_1B.yaml", [f"{_CP}=0"], f"{_CP}: must be >= 1, got 0"),
    ],
    ids=["packing", "zero"],
)
def test_context_parallel_refusals_name_the_key(config, overrides, problem):
    with pytest.raises(ConfigError) as err:
        load_validated_config(REPO / "configs" / config, overrides, grpo_schema())
    assert problem in err.value.problems


def test_context_parallel_counts_in_the_model_parallel_size():
    cfg = load_validated_config(REPO / "configs" / "grpo_math_1B.yaml", [f"{_CP}=2"], grpo_schema())
    assert cfg.policy.model_parallel_size() == 2
    both = [f"{_CP}=2", "policy.dtensor_cfg.tensor_parallel_size=2"]  # a replica's cp x tp ranks hold the same rows
    cfg = load_validated_config(REPO / "configs" / "grpo_math_1B.yaml", both, grpo_schema())
    assert cfg.policy.model_parallel_size() == 4


def test_cli_exits_2_with_one_line_per_problem(capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_config_from_cli(
            grpo_schema(), REPO / "configs" / "grpo_math_1B.yaml", ["++policy.precison=float32", "++grpo.seed=abc"]
        )
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        "Invalid config (2 problems):",
        "  grpo.seed: expected int, got str 'abc'",
        "  policy.precison: unknown key (did you mean policy.precision?)",
    ]


@pytest.mark.parametrize("script", ["run_grpo_math.py", "run_grpo.py"])  # run_grpo.py: NeMo-RL's current name
def test_run_grpo_typo_exits_2_and_names_the_key(script):
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / script), "grpo.num_prompts_per_stpe=4"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert "did you mean grpo.num_prompts_per_step?" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bound_checks_name_each_field_below_its_minimum():
    with pytest.raises(ConfigError) as err:
        load_validated_config(
            REPO / "configs" / "grpo_smoke.yaml",
            ["cluster.num_nodes=0", "grpo.max_num_steps=0", "data.reasoning_gym.val_size=-1"],
            grpo_schema(),
        )
    assert err.value.problems == [
        "grpo.max_num_steps: must be >= 1, got 0",
        "data.reasoning_gym.val_size: must be >= 0, got -1",
        "cluster.num_nodes: must be >= 1, got 0",
    ]


# ---------------------------------------------------------------- ~key: delete, never "back to the default"
def test_delete_is_refused_where_the_default_would_come_back(tmp_path):
    path = write(tmp_path / "c.yaml", "steps: 3\ninner: {lr: 0.5, names: [x]}\nextra: {k: 1, j: 2}\nbatch: 8\n")
    with pytest.raises(ConfigError) as err:
        load_validated_config(path, ["~inner.lr", "~inner", "~batch"], Outer)
    assert err.value.problems == [
        "override '~inner.lr': cannot delete inner.lr: a missing key takes its default (0.001), so ~ would restore "
        "it; set inner.lr=<value> instead",
        "override '~inner': cannot delete inner: a missing key takes its default (a section), so ~ would restore "
        "it; set inner=<value> instead",
        "override '~batch': cannot delete batch: a missing key takes its default (8), so ~ would restore it; set "
        "batch=<value> instead",
    ]
    # A null default, and keys inside a free-form mapping, are really removed.
    cfg = load_validated_config(path, ["~inner.names", "~extra.k"], Outer)
    assert cfg.inner.names is None and cfg.extra == {"j": 2}


def test_readme_scheduler_example_is_written_as_null():
    """`~policy.scheduler` would restore the default warm-up schedule; `policy.scheduler=null` is a constant LR."""
    with pytest.raises(ConfigError) as err:
        load_validated_config(REPO / "configs" / "grpo_math_1B.yaml", ["~policy.scheduler"], grpo_schema())
    (problem,) = err.value.problems
    assert problem.endswith("so ~ would restore it; write policy.scheduler=null to unset it")
    cfg = load_validated_config(REPO / "configs" / "grpo_math_1B.yaml", ["policy.scheduler=null"], grpo_schema())
    assert cfg.policy.scheduler is None
    readme = (REPO / "README.md").read_text()
    assert "policy.scheduler=null" in readme and "~policy.scheduler" not in readme


def test_optimizer_is_unset_with_null_not_tilde():
    """The Megatron recipes need `policy.optimizer=null`; `~policy.optimizer` would bring the AdamW default back."""
    with pytest.raises(ConfigError) as err:
        load_validated_config(REPO / "configs" / "grpo_math_1B.yaml", ["~policy.optimizer"], grpo_schema())
    (problem,) = err.value.problems
    assert problem.endswith("so ~ would restore it; write policy.optimizer=null to unset it")
    overrides = [
        "policy.optimizer=null",
        "policy.scheduler=null",
        "policy.dtensor_cfg.enabled=false",
        "policy.megatron_cfg.enabled=true",
    ]
    cfg = load_validated_config(REPO / "configs" / "grpo_math_1B.yaml", overrides, grpo_schema())
    assert cfg.policy.optimizer is None and cfg.policy.megatron_cfg.enabled


# ---------------------------------------------------------------- every recipe in configs/ validates


def _schema_of(path: Path) -> type:
    """The master config of the entry point that runs ``path`` (by its name: grpo*, sft*, dpo*, rm*, distillation*,
    ppo*, evals/*)."""
    from nemo_rl_clone.algorithms.distillation.config import DistillationMasterConfig
    from nemo_rl_clone.algorithms.dpo import DPOMasterConfig
    from nemo_rl_clone.algorithms.ppo.config import PPOMasterConfig
    from nemo_rl_clone.algorithms.rm import RMMasterConfig
    from nemo_rl_clone.algorithms.sft import SFTMasterConfig
    from nemo_rl_clone.evals.config import EvalMasterConfig

    relative = path.relative_to(REPO / "configs").as_posix()
    schemas = {"evals/": EvalMasterConfig, "grpo": grpo_schema(), "gdpo": grpo_schema(), "sft": SFTMasterConfig}
    schemas |= {"dpo": DPOMasterConfig, "rm": RMMasterConfig, "distillation": DistillationMasterConfig}
    schemas |= {"ppo": PPOMasterConfig}
    for prefix, schema in schemas.items():
        if relative.startswith(prefix):
            return schema
    raise AssertionError(f"configs/{relative}: no entry point runs it; name it after its run")


@pytest.mark.parametrize(
    "path", sorted((REPO / "configs").rglob("*.yaml")), ids=lambda p: p.relative_to(REPO / "configs").as_posix()
)
def test_every_recipe_validates(path):
    load_validated_config(path, [], _schema_of(path))


@pytest.mark.parametrize(
    "override,problem",
    [
        ("policy.generation.temperature=2.5", "must be in [0, 2.0] (vLLM's range), got 2.5"),
        ("policy.generation.temperature=-0.1", "must be in [0, 2.0] (vLLM's range), got -0.1"),
        ("policy.generation.temperature=0.005", "must be 0 (greedy) or at least 0.01: vLLM samples at 0.01"),
    ],
    ids=["above_vllms_cap", "negative", "below_vllms_floor"],
)
def test_sampling_temperature_is_checked_at_load_time(override, problem):
    """A temperature vLLM refuses (or silently changes) fails validation, before Ray or an engine starts."""
    with pytest.raises(ConfigError) as err:
        load_validated_config(REPO / "configs" / "grpo_math_1B.yaml", [override], grpo_schema())
    assert any(line.startswith("policy.generation.temperature: " + problem) for line in err.value.problems), (
        err.value.problems
    )
