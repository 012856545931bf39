"""Every YAML file of NeMo-RL v0.7.0's ``examples/`` folder, loaded and validated as a NeMo-RL user would run it.

Each recipe is validated by the schema of the algorithm whose section it has (``grpo``, ``sft``, ``dpo``, ``rm``,
``distillation``, ``eval``, ``ppo``) and lands in one category: it validates, or every problem it has is one
``not supported yet`` line, or it is one of `NEMO_RL_REFUSES`, which NeMo-RL v0.7.0 refuses as well. Nothing else is
allowed: no ``unknown key``, no value NeMo-RL accepts refused as wrong.
The counts must match what docs/porting.md states. The folder is not part of this repository: the test skips
without it. ``${oc.env:HF_HOME}`` / ``${oc.env:PERSISTENT_CACHE}`` get placeholder paths, as NeMo-RL users set them.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from nemo_rl_clone.algorithms.distillation.config import DistillationMasterConfig
from nemo_rl_clone.algorithms.dpo import DPOMasterConfig
from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
from nemo_rl_clone.algorithms.ppo.config import PPOMasterConfig
from nemo_rl_clone.algorithms.rm import RMMasterConfig
from nemo_rl_clone.algorithms.sft import SFTMasterConfig
from nemo_rl_clone.evals.config import EvalMasterConfig
from nemo_rl_clone.utils.config import load_config, load_validated_config, resolve_to_container
from nemo_rl_clone.utils.config_validation import ConfigError, validate_config

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO.parent / "shared" / "nemo-rl-v0.7.0-examples" / "examples"
SCHEMAS = {
    "grpo": GRPOMasterConfig,
    "sft": SFTMasterConfig,
    "dpo": DPOMasterConfig,
    "rm": RMMasterConfig,
    "distillation": DistillationMasterConfig,
    "eval": EvalMasterConfig,
    "ppo": PPOMasterConfig,
}
NOT_SUPPORTED = "not supported yet"
REFUSED_AS_NEMO_RL = "refused as NeMo-RL refuses it"
# Recipes NeMo-RL v0.7.0 itself stops at setup, with the problem line ours gives.
NEMO_RL_REFUSES = {
    # inherits prorlv2.v2.yaml's batch_multiplier 1.5 and turns dynamic sampling off: NeMo-RL asserts the multiplier
    # is 1 without dynamic sampling
    "configs/prorlv2_1_moe.v2.yaml": [
        "grpo.batch_multiplier: only applies with use_dynamic_sampling; set it to 1 (got 1.5)"
    ],
}

pytestmark = pytest.mark.skipif(not EXAMPLES.is_dir(), reason=f"NeMo-RL v0.7.0's examples are not at {EXAMPLES}")


def recipe_files() -> list[Path]:
    # quant_configs/ holds ModelOpt quantisation settings that recipes name by path, not recipes.
    return sorted(p for p in EXAMPLES.rglob("*.yaml") if "quant_configs" not in p.parts)


def classify(path: Path) -> tuple[str, list[str]]:
    """(category, problem lines): ``accepted``, ``not supported yet``, `REFUSED_AS_NEMO_RL`, ``other``; or ``not a
    recipe`` (no algorithm section: the fault-tolerance launcher's config and a prefetch list)."""
    try:
        config = load_config(path)
        algorithm = next((name for name in SCHEMAS if name in config), None)
        if algorithm is None:
            return "not a recipe", []
        validate_config(resolve_to_container(config), SCHEMAS[algorithm])
    except ConfigError as err:
        if err.problems == NEMO_RL_REFUSES.get(str(path.relative_to(EXAMPLES))):
            return REFUSED_AS_NEMO_RL, err.problems
        category = NOT_SUPPORTED if all(NOT_SUPPORTED in line for line in err.problems) else "other"
        return category, err.problems
    return "accepted", []


@pytest.fixture(scope="module")
def outcomes() -> dict[str, tuple[str, list[str]]]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HOME", "/tmp/hf_home")
        env.setenv("PERSISTENT_CACHE", "/tmp/persistent_cache")
        return {str(path.relative_to(EXAMPLES)): classify(path) for path in recipe_files()}


def test_every_recipe_validates_or_names_what_is_not_supported(outcomes):
    other = {name: problems for name, (category, problems) in outcomes.items() if category == "other"}
    assert not other, "\n".join(
        f"{name}: {[p for p in problems if NOT_SUPPORTED not in p]}" for name, problems in other.items()
    )


def test_the_counts_are_the_documented_ones(outcomes):
    counts = Counter(category for category, _ in outcomes.values())
    text = (REPO / "docs" / "porting.md").read_text()
    documented = re.search(
        r"(\d+) YAML files: (\d+) validate, (\d+) stop with `not supported yet` lines only, (\d+) (?:is|are) refused "
        r"as NeMo-RL v0\.7\.0 refuses (?:it|them)\s*(?:\([^)]*\))?, (\d+) are not recipes",
        text,
    )
    assert documented, "docs/porting.md must state the recipe-tree count"
    total, accepted, refused, as_nemo_rl, not_recipes = map(int, documented.groups())
    assert (
        len(outcomes),
        counts["accepted"],
        counts[NOT_SUPPORTED],
        counts[REFUSED_AS_NEMO_RL],
        counts["not a recipe"],
    ) == (total, accepted, refused, as_nemo_rl, not_recipes)
    assert sum(counts.values()) == total


def test_recipes_named_in_the_docs_validate(outcomes):
    """The base recipes a NeMo-RL user starts from, and ones that use the values this library used to refuse."""
    for name in (
        "configs/grpo_math_1B.yaml",
        "configs/sft.yaml",
        "configs/dpo.yaml",
        "configs/ppo_math_1B.yaml",
        "configs/rm.yaml",
        "configs/recipes/llm/grpo-deepscaler-1.5b-8K.yaml",  # checkpointing.model_save_format: null
        "configs/recipes/llm/grpo-nano-v2-12b-1n8g-megatron.yaml",  # policy.optimizer beside megatron_cfg
        "configs/evals/local_eval.yaml",  # a CSV named by URL, problem_key / solution_key
    ):
        assert outcomes[name] == ("accepted", []), (name, outcomes[name])
    # Engine tensor parallelism (TP 2 here) was its one refusal; its DAPO values carry their NeMo-RL meaning.
    dapo = EXAMPLES / "configs" / "recipes" / "llm" / "dapo-qwen2.5-7b.v2.yaml"
    assert outcomes[str(dapo.relative_to(EXAMPLES))] == ("accepted", [])
    config = load_validated_config(dapo, [], GRPOMasterConfig)
    assert config.policy.generation.vllm_cfg.tensor_parallel_size == 2
    assert config.env["math"].math_verify_impl == "dapo_math_verify"
    assert (config.grpo.use_dynamic_sampling, config.grpo.batch_multiplier) == (True, 3.0)
    assert config.grpo.prompts_per_generation_batch == 3 * config.grpo.num_prompts_per_step
    assert config.checkpointing.model_save_format is None and not config.checkpointing.save_consolidated
