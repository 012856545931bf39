"""Every key a config accepts does something: it is read by the code, or refused when set.

The walk covers every field of every master config (GRPO, SFT, DPO, RM, evaluation), recursively. A field is *read*
when the package reads an attribute of that name (``x.field``, ``getattr(x, "field")``) outside validation code
(functions named ``check``, ``check_*`` or ``_check*``: validation reading a field is not using it), or when a whole
section is handed on (``dataclasses.asdict(x.section)``, ``vars(x.section)``). Matching is by field name, so the walk
catches keys that nothing reads at all (the way ``policy.logprob_chunk_size`` and ``checkpointing.model_save_format``
once validated and did nothing); it cannot tell two sections' ``enabled`` apart.

Fields that are not read must be listed in ``REFUSED`` below, and each refusal is checked by validating a config that
sets it: the one-line error naming the key must come out.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nemo_rl_clone.algorithms.dpo import DPOMasterConfig
from nemo_rl_clone.algorithms.grpo_config import AsyncGRPOConfig, GRPOConfig, GRPOMasterConfig
from nemo_rl_clone.algorithms.rm import RMMasterConfig
from nemo_rl_clone.algorithms.sft import SFTMasterConfig
from nemo_rl_clone.environments.config import MathEnvConfig
from nemo_rl_clone.evals.config import EvalMasterConfig
from nemo_rl_clone.models.generation.config import GenerationConfig, VllmConfig
from nemo_rl_clone.models.policy.config import (
    DTensorConfig,
    MegatronConfig,
    RewardModelConfig,
    SequencePackingConfig,
)
from nemo_rl_clone.utils.config_validation import ConfigError, _dataclass_in, validate_config
from nemo_rl_clone.utils.logger import LoggerConfig

PACKAGE = Path(__file__).resolve().parents[2] / "nemo_rl_clone"

# Each master config with the smallest overrides that make its defaults valid.
MASTERS: dict[str, tuple[type, dict[str, Any]]] = {
    "grpo": (GRPOMasterConfig, {}),
    "sft": (SFTMasterConfig, {"policy": {"max_total_sequence_length": 1024}}),
    "dpo": (DPOMasterConfig, {"policy": {"max_total_sequence_length": 1024}}),
    "rm": (RMMasterConfig, {"policy": {"max_total_sequence_length": 1024, "reward_model_cfg": {"enabled": True}}}),
    "eval": (EvalMasterConfig, {"logger": {}}),
}


@dataclasses.dataclass(frozen=True)
class Refusal:
    value: Any  # a value that is refused
    message: str  # the error after "<dotted key>: "
    masters: tuple[str, ...] = tuple(MASTERS)  # the runs that refuse it (elsewhere the field must be read)


# (schema class, field) → how setting it is refused. A section refused through its `enabled` key (async GRPO,
# Megatron Core, sequence packing) covers the section's other keys: they are only meaningful when it is enabled.
REFUSED: dict[tuple[type, str], Refusal] = {
    (AsyncGRPOConfig, "enabled"): Refusal(True, "async GRPO is not supported yet; set it to false"),
    (GRPOConfig, "batch_multiplier"): Refusal(2, "only 1 is supported yet (got 2)"),
    (MegatronConfig, "enabled"): Refusal(
        True, "the Megatron Core backend is not supported yet; use dtensor_cfg.enabled=true"
    ),
    (SequencePackingConfig, "enabled"): Refusal(
        True, "sequence packing is not supported yet by the DTensor worker; use policy.dynamic_batching instead"
    ),
    (DTensorConfig, "sequence_parallel"): Refusal(True, "sequence parallelism is not supported yet; set it to false"),
    (DTensorConfig, "context_parallel_size"): Refusal(
        2, "context parallelism is not supported yet; set it to 1 (got 2)"
    ),
    (GenerationConfig, "backend"): Refusal("hf", "the 'hf' generation backend is not supported yet; use 'vllm'"),
    (VllmConfig, "async_engine"): Refusal(True, "the async vLLM engine is not supported yet; set it to false"),
    # One value is implemented; the key exists so that NeMo-RL configs naming it validate.
    (RewardModelConfig, "reward_model_type"): Refusal("pairwise", "must be one of ['bradley_terry'], got 'pairwise'"),
    (MathEnvConfig, "math_verify_impl"): Refusal("other", "must be one of 'hf_math_verify', got 'other'"),
    # Read by GRPO only (it prints validation generations); the other runs have none to print.
    (LoggerConfig, "num_val_samples_to_print"): Refusal(
        2, "only GRPO prints validation samples; {run} has none, set it to 0", ("sft", "dpo", "rm", "eval")
    ),
}
# Sections whose `enabled` refusal above covers every other key in them.
REFUSED_SECTIONS = (AsyncGRPOConfig, MegatronConfig, SequencePackingConfig)


def walk(schema: type, prefix: str = "") -> Iterator[tuple[str, type, str, Any]]:
    """(dotted key, owning dataclass, field name, field type) of every field, depth first."""
    hints = typing.get_type_hints(schema)
    for field in dataclasses.fields(schema):
        dotted = f"{prefix}.{field.name}" if prefix else field.name
        yield dotted, schema, field.name, hints[field.name]
        inner = _dataclass_in(hints[field.name])
        if inner is not None:
            yield from walk(inner, dotted)


class _Reads(ast.NodeVisitor):
    """Attribute names the package reads outside validation code, and sections it hands on whole."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.whole: set[str] = set()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if node.name == "check" or node.name.startswith(("check_", "_check")):
            return
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.ctx, ast.Load):
            self.names.add(node.attr)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if func == "getattr" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            self.names.add(node.args[1].value)
        if func in ("asdict", "vars") and node.args and isinstance(node.args[0], ast.Attribute):
            self.whole.add(node.args[0].attr)
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        # `SupervisedAlgorithm.section` names the config section the shared loop reads with getattr.
        for statement in node.body:
            if (
                isinstance(statement, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "section" for t in statement.targets)
                and isinstance(statement.value, ast.Constant)
            ):
                self.names.add(statement.value.value)
        self.generic_visit(node)


def code_reads(package: Path = PACKAGE) -> _Reads:
    reads = _Reads()
    for path in sorted(package.rglob("*.py")):
        reads.visit(ast.parse(path.read_text(), filename=str(path)))
    return reads


def unused_keys(master: str, reads: _Reads) -> list[str]:
    """Keys of ``master`` that are neither read nor refused there."""
    schema = MASTERS[master][0]
    unused = []
    covered: list[str] = []  # sections read whole or refused whole: their keys need no check
    for dotted, owner, name, tp in walk(schema):
        if any(dotted.startswith(prefix + ".") for prefix in covered):
            continue
        section = _dataclass_in(tp)
        if section in REFUSED_SECTIONS:
            covered.append(dotted)
            continue
        if name in reads.whole:
            covered.append(dotted)
        if section is not None and not dataclasses.fields(section):
            continue  # an empty section (logger.tensorboard) holds no key
        refusal = _refusal(owner, name)
        if refusal is not None and master in refusal.masters:
            continue
        if name not in reads.names and name not in reads.whole:
            unused.append(dotted)
    return unused


def _refusal(owner: type, name: str) -> Refusal | None:
    for (cls, field), refusal in REFUSED.items():
        if issubclass(owner, cls) and field == name:
            return refusal
    return None


@pytest.mark.parametrize("master", list(MASTERS))
def test_every_key_is_read_or_refused(master: str) -> None:
    unused = unused_keys(master, code_reads())
    assert not unused, (
        f"{master}: these keys validate but nothing reads them: {unused}; implement them, or refuse them in their "
        "schema's check() and list them in REFUSED"
    )


def _refused_cases() -> Iterator[tuple[str, str, Refusal]]:
    for master, (schema, _) in MASTERS.items():
        for dotted, owner, name, _tp in walk(schema):
            refusal = _refusal(owner, name)
            if refusal is None or master not in refusal.masters:
                continue
            yield master, dotted, refusal


@pytest.mark.parametrize(("master", "key", "refusal"), list(_refused_cases()))
def test_refused_key_fails_validation_with_one_line(master: str, key: str, refusal: Refusal) -> None:
    schema, base = MASTERS[master]
    validate_config(base, schema)  # the base config is valid, so the problem below comes from `key`
    config = _with(base, key, refusal.value)
    with pytest.raises(ConfigError) as raised:
        validate_config(config, schema)
    run = "evaluation" if master == "eval" else master
    assert f"{key}: {refusal.message.format(run=run)}" in raised.value.problems


def _with(base: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``base`` with ``dotted`` set to ``value``."""
    config = copy.deepcopy(base)
    node = config
    *parents, leaf = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return config


def test_the_walk_finds_an_unread_key(tmp_path: Path) -> None:
    """A key only validation reads is reported: the walk can fail."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text(
        "class C:\n    def check(self):\n        return self.logprob_chunk_size\n"
        "def run(config):\n    return config.policy.precision\n"
    )
    reads = code_reads(package)
    assert "precision" in reads.names and "logprob_chunk_size" not in reads.names
    assert "policy.logprob_chunk_size" in unused_keys("grpo", reads)
