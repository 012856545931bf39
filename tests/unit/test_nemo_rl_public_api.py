"""Coverage of NeMo-RL v0.7.0's public API (issue 53): every row of its list, at our path.

The list (``../shared/nemo-rl-v0.7.0-public-api.tsv``: module, kind, name, parameters, used_by) holds NeMo-RL's
top-level names (functions, classes, constants, re-exports) and public methods. Each row, with ``nemo_rl`` replaced
by ``nemo_rl_clone``, is

- present: the module imports and has the name (a method: its class has it);
- refused: importing the module, or reading the name, stops with our one line naming an unbuilt feature
  (`UnsupportedFeatureError`, the modules of `nemo_rl_clone.facades.REFUSED`);
- missing: the module or the name does not exist;
- not NeMo-RL's: a row the list attributes to a module by mistake (`NOT_NEMO_RL_NAMES`).

A present function, class or method has NeMo-RL's parameter names, kinds, order and defaults (a class: its
``__init__`` parameters, or its fields where the list records fields), unless `DELIBERATE` lists the difference with
its reason; docs/porting.md names each such difference and states the counts, which must equal the computed ones.
Print the counts and lists: ``uv run python tests/unit/test_nemo_rl_public_api.py``.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import os
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple, is_typeddict

import pytest

from nemo_rl_clone.utils.unsupported_modules import UnsupportedFeatureError

REPO = Path(__file__).resolve().parents[2]
API_LIST = REPO.parent / "shared" / "nemo-rl-v0.7.0-public-api.tsv"
PORTING = REPO / "docs" / "porting.md"

PRESENT, REFUSED, MISSING, NOT_NEMO_RL = "present", "refused", "missing", "not NeMo-RL's"
CATEGORIES = (PRESENT, REFUSED, MISSING, NOT_NEMO_RL)
SIGNATURE_CATEGORIES = ("the same", "extended", "deliberately different", "not yet matched")

# Rows of the list that are not NeMo-RL's names: functions an example script defines itself, attributed by the list
# to the module imported just before them.
NOT_NEMO_RL_NAMES: dict[str, str] = {
    "nemo_rl.utils.logger.parse_args": "each example script's own argument parser",
    "nemo_rl.utils.logger._select_trainer": "run_grpo.py's own function",
    "nemo_rl.utils.native_checkpoint.parse_args": "convert_dcp_to_hf.py's own argument parser",
    "nemo_rl.models.policy.tq_policy._make_policy": "a closure inside run_grpo.py's main",
    "nemo_rl.distributed.batched_data_dict.example_custom_dataloader": "examples/custom_dataloader's own function",
}

# Present names whose parameters differ from NeMo-RL's on purpose: NeMo-RL's qualified name → why (docs/porting.md).
# A difference that only extends NeMo-RL's (more optional parameters, a default for a required one) needs no entry.
_SAVE_STATE = "every algorithm saves the one shared RunState"
_ADVANTAGES_ON_GPU = (
    "calculate_advantages_on_gpu is accepted at either value, not a field: the driver computes the advantages, the "
    "same numbers either way"
)
_GENERATION_CLASSES = ("interfaces.GenerationInterface", "vllm.vllm_generation.VllmGeneration")
_TAGS = "names the one argument it reads (tags) instead of *args, **kwargs"
_NO_ARGUMENTS = "takes no arguments instead of *args, **kwargs"
DELIBERATE: dict[str, str] = {
    **{f"nemo_rl.algorithms.{m}.{c}SaveState": _SAVE_STATE for m, c in (("sft", "SFT"), ("dpo", "DPO"), ("rm", "RM"))},
    **{f"nemo_rl.algorithms.{m}.{c}SaveState": _SAVE_STATE for m, c in (("grpo", "GRPO"), ("ppo", "PPO"))},
    "nemo_rl.algorithms.distillation.DistillationSaveState": _SAVE_STATE,
    "nemo_rl.algorithms.logits_sampling_utils.apply_top_k_top_p": "the same default: chunk_size=256 is "
    "TOP_K_TOP_P_CHUNK_SIZE's value (a named default reads as its value here)",
    "nemo_rl.distributed.batched_data_dict.BatchedDataDict": "a dict subclass (NeMo-RL: UserDict), built like a dict",
    "nemo_rl.distributed.batched_data_dict.BatchedDataDict.reorder_data": "spelled reordered_indices (NeMo-RL: "
    "reorded_indices); positional calls work either way",
    "nemo_rl.distributed.virtual_cluster.RayVirtualCluster": "placement_group_strategy defaults to STRICT_PACK: one "
    "placement group per node keeps each node's workers on one machine",
    "nemo_rl.distributed.worker_groups.RayWorkerGroup": "env_vars defaults to None (no variables), not a shared "
    "mutable {}",
    **{f"nemo_rl.algorithms.{m}.{c}Config": _ADVANTAGES_ON_GPU for m, c in (("grpo", "GRPO"), ("ppo", "PPO"))},
    **{
        f"nemo_rl.algorithms.{m}.validate": "validate(run) rolls out the run's validation prompts and returns the "
        "metrics; NeMo-RL's form from separate parts is not built"
        for m in ("grpo", "ppo")
    },
    "nemo_rl.algorithms.loss.interfaces.LossFunction": "a loss declares accepts_token_logprobs and takes the logits "
    "or token logprobs as its first argument, not NeMo-RL's input_type keyword inputs",
    "nemo_rl.data.DataConfig": "one data section per algorithm: add_bos, add_eos and add_generation_prompt are SFT's "
    "(SFTDataConfig); several dataloaders (num_prompts_per_dataloader, custom_dataloader) not built: refused by name",
    "nemo_rl.environments.code_environment.CodeEnvConfig": "scores a program against its tests in one turn, which "
    "ends the episode: terminate_on_evaluation true is accepted, false (multi-turn execution) refused by name",
    "nemo_rl.environments.math_environment.MathEnvConfig": "stop_strings (stop strings set by the environment) not "
    "built: refused by name unless null; verifier_type: math, english_multichoice and multilingual_multichoice "
    "built, NeMo-RL's others refused by name",
    "nemo_rl.models.generation.vllm.vllm_generation.VllmGeneration": "takes the model to serve as its third "
    "argument (NeMo-RL reads config['model_name']); workers_per_node and defer_model_load not built",
    **{f"nemo_rl.models.generation.{c}.prepare_for_generation": _TAGS for c in _GENERATION_CLASSES},
    **{f"nemo_rl.models.generation.{c}.finish_generation": _NO_ARGUMENTS for c in _GENERATION_CLASSES},
    **{
        f"nemo_rl.models.policy.{c}.{m}": _NO_ARGUMENTS
        for c in ("interfaces.PolicyInterface", "lm_policy.Policy")
        for m in ("prepare_for_training", "finish_training")
    },
    "nemo_rl.models.policy.lm_policy.Policy.prepare_for_lp_inference": _NO_ARGUMENTS,
    "nemo_rl.models.policy.interfaces.PolicyInterface.save_checkpoint": "names its parameters (Policy.save_checkpoint's) "
    "instead of *args, **kwargs",
    "nemo_rl.utils.checkpoint.CheckpointingConfig": "NeMo Automodel and Megatron-Bridge keys (model_cache_dir, "
    "model_repo_id, is_peft, peft_config, is_async, pretrained_checkpoint) not built: refused by name when on",
}

# Present names whose parameters differ and should not (issue 53): fix one, then remove it here.
NOT_YET_MATCHED: frozenset[str] = frozenset()


class Row(NamedTuple):
    module: str  # NeMo-RL's
    kind: str  # def, class(...), method, name, reexport
    name: str  # a method is "Class.method"
    parameters: str  # "(a, b=1, *, c)" or "fields: a, b" or ""
    used_by: str  # "examples", "docs", "docs,examples" or ""

    @property
    def qualified(self) -> str:
        return f"{self.module}.{self.name}"


class Param(NamedTuple):
    name: str
    kind: inspect._ParameterKind
    default: str | None  # the default's source text (ours: its repr when no literal matches), None without one


def ours(module: str) -> str:
    """Our path of NeMo-RL's module ``module``."""
    return "nemo_rl_clone" + module.removeprefix("nemo_rl")


@functools.cache
def api_rows() -> tuple[Row, ...]:
    lines = API_LIST.read_text(encoding="utf-8").splitlines()
    assert lines[0].split("\t") == ["module", "kind", "name", "parameters", "used_by"], lines[0]
    return tuple(Row(*(line.split("\t") + [""] * 5)[:5]) for line in lines[1:] if line.strip())


@functools.cache
def import_ours(module: str) -> ModuleType | str:
    """Our module at NeMo-RL's path ``module``, or why not: `REFUSED` or `MISSING`. Any other import error is a bug
    (a missing third-party package included) and propagates."""
    path = ours(module)
    try:
        return importlib.import_module(path)
    except UnsupportedFeatureError:
        return REFUSED
    except ModuleNotFoundError as error:
        if error.name and (path == error.name or path.startswith(error.name + ".")):
            return MISSING
        raise


def lookup(row: Row) -> tuple[str, Any]:
    """(category, our object) for one row."""
    if row.qualified in NOT_NEMO_RL_NAMES:
        return NOT_NEMO_RL, None
    module = import_ours(row.module)
    if isinstance(module, str):
        return module, None
    owner, _, member = row.name.rpartition(".") if row.kind == "method" else ("", "", row.name)
    try:
        found = getattr(module, owner or member)
        if owner:
            found = _static_member(found, member)
    except UnsupportedFeatureError:
        return REFUSED, None
    except AttributeError:
        return MISSING, None
    return PRESENT, getattr(getattr(found, "__ray_metadata__", None), "modified_class", found)  # a Ray actor: its class


def _static_member(cls: Any, name: str) -> Any:
    """The member as defined (a classmethod stays one), so that its own parameters, ``self``/``cls`` included, show."""
    try:
        return inspect.getattr_static(cls, name)
    except AttributeError:
        return getattr(cls, name)  # a member a metaclass or ``__getattr__`` provides


def parse_parameters(text: str) -> list[Param]:
    """NeMo-RL's parameters as the list writes them, ``(self, a, b=1, *args, c, **kwargs)``."""
    args = ast.parse(f"def _{text}: pass").body[0].args  # type: ignore[attr-defined]
    positional = args.posonlyargs + args.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    kinds = [inspect.Parameter.POSITIONAL_ONLY] * len(args.posonlyargs)
    kinds += [inspect.Parameter.POSITIONAL_OR_KEYWORD] * len(args.args)
    params = [Param(a.arg, k, _source(d)) for a, k, d in zip(positional, kinds, defaults, strict=True)]
    if args.vararg:
        params.append(Param(args.vararg.arg, inspect.Parameter.VAR_POSITIONAL, None))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        params.append(Param(arg.arg, inspect.Parameter.KEYWORD_ONLY, _source(default)))
    if args.kwarg:
        params.append(Param(args.kwarg.arg, inspect.Parameter.VAR_KEYWORD, None))
    return params


def _source(node: ast.expr | None) -> str | None:
    return None if node is None else ast.unparse(node)


def our_parameters(obj: Any, theirs: list[Param]) -> list[Param]:
    """Our parameters, written so that they compare with NeMo-RL's: a default that equals NeMo-RL's literal default
    is written as NeMo-RL writes it, any other default by its ``repr``."""
    function = obj.__func__ if isinstance(obj, classmethod | staticmethod) else obj
    signature = inspect.signature(function)
    their_defaults = {p.name: p.default for p in theirs}
    params = []
    for p in signature.parameters.values():
        if p.name == "_ray_trace_ctx":  # added by Ray to an actor's methods
            continue
        default = None
        if p.default is not inspect.Parameter.empty:
            default = repr(p.default)
            written = their_defaults.get(p.name)
            if written is not None and _same_default(p.default, written):
                default = written
        params.append(Param(p.name, p.kind, default))
    return params


def _same_default(value: Any, written: str) -> bool:
    """Whether our default ``value`` is NeMo-RL's default written ``written``: equal literals (a bool only equals a
    bool), or for a non-literal default (an enum member, a function) the same last dotted name."""
    try:
        literal = ast.literal_eval(written)
    except (ValueError, SyntaxError):
        name = getattr(value, "__name__", None) or getattr(value, "name", None) or repr(value)
        return written.rsplit(".", 1)[-1] == str(name).rsplit(".", 1)[-1]
    if isinstance(literal, bool) or isinstance(value, bool):
        return type(literal) is type(value) and literal == value
    if isinstance(literal, list | tuple) and isinstance(value, list | tuple):  # a tuple where NeMo-RL has a list
        return list(literal) == list(value)
    try:
        return bool(literal == value)
    except Exception:  # an array-like default compares element-wise
        return False


def field_names(cls: Any) -> tuple[list[str], bool] | None:
    """Our class's fields and whether they are positional (a dataclass or named tuple, where order matters), or None
    when it has no fields to read."""
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)], True
    if isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return list(cls._fields), True
    if hasattr(cls, "model_fields"):  # pydantic
        return list(cls.model_fields), False
    if is_typeddict(cls) or isinstance(cls, type):
        return list(getattr(cls, "__annotations__", {})), False
    return None


class Difference(NamedTuple):
    what: str  # ours and NeMo-RL's
    extends: bool  # every call written for NeMo-RL's binds to ours with the same meaning


def parameter_problem(row: Row, obj: Any) -> Difference | None:
    """How our ``obj``'s parameters differ from NeMo-RL's of ``row``, or None when they are the same (or the list
    records none)."""
    if row.parameters.startswith("fields:"):
        return _fields_problem(row, obj)
    if not row.parameters.startswith("("):
        return None
    theirs = parse_parameters(row.parameters)
    if isinstance(obj, functools.cached_property):
        obj = obj.func
    if isinstance(obj, property):
        obj = obj.fget
    static_with_self = isinstance(obj, staticmethod) and theirs[:1] and theirs[0].name in ("self", "cls")
    if (inspect.isclass(obj) and row.kind != "method") or static_with_self:
        # ``self``: bound by the class's own signature, or never passed to a static method (the list writes some
        # static methods without it: SlidingPuzzleGameLogic's)
        theirs = theirs[1:]
    try:
        mine = our_parameters(obj, theirs)
    except (TypeError, ValueError) as error:
        return Difference(f"no readable signature ({error})", False)
    if mine == theirs:
        return None
    return Difference(f"ours ({_written(mine)}), NeMo-RL's ({_written(theirs)})", _extends(mine, theirs))


def _extends(mine: list[Param], theirs: list[Param]) -> bool:
    """Whether ours only adds to NeMo-RL's: each of its parameters is ours too, of the same kind, at the same position
    and with the same default where it has one (ours may give a required one a default); each parameter of ours it
    lacks is optional and comes after its positional ones."""
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    my_positions = [p.name for p in mine if p.kind in positional]
    their_positions = [p.name for p in theirs if p.kind in positional]
    if my_positions[: len(their_positions)] != their_positions:
        return False
    by_name = {p.name: p for p in mine if p.kind not in variadic}
    for their in theirs:
        if their.kind in variadic:
            if not any(p.kind is their.kind for p in mine):
                return False
            continue
        my = by_name.get(their.name)
        if my is None or (my.kind is not their.kind and my.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD):
            return False
        if their.default is not None and my.default != their.default:
            return False
    their_names = {p.name for p in theirs}
    return all(p.default is not None or p.kind in variadic for p in mine if p.name not in their_names)


def _fields_problem(row: Row, obj: Any) -> Difference | None:
    # ``__extra__``: a TypedDict's open extra keys (PEP 728), not a field
    fields = (name.strip() for name in row.parameters.removeprefix("fields:").split(","))
    theirs = [name for name in fields if name and not name.startswith("__")]
    found = field_names(obj)
    if found is None:
        return Difference(f"no fields (NeMo-RL's: {', '.join(theirs)})", False)
    mine, positional = found
    absent = [name for name in theirs if name not in mine]
    if absent:
        return Difference(f"fields missing: {', '.join(absent)}", False)
    # Order matters where NeMo-RL's class is built positionally (a dataclass or named tuple), not for a TypedDict or
    # pydantic model, whose fields are passed by name.
    built_positionally = row.kind == "class" or "NamedTuple" in row.kind
    if built_positionally and positional and mine[: len(theirs)] != theirs:
        return Difference(f"field order: ours {', '.join(mine)}; NeMo-RL's {', '.join(theirs)}", False)
    return None


def _written(params: list[Param]) -> str:
    out, star = [], False
    for p in params:
        if p.kind is inspect.Parameter.KEYWORD_ONLY and not star:
            out.append("*")
        star = star or p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.KEYWORD_ONLY)
        prefix = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}.get(p.kind, "")
        out.append(prefix + p.name + ("" if p.default is None else f"={p.default}"))
    return ", ".join(out)


class Coverage(NamedTuple):
    categories: dict[Row, str]
    checked: int  # present names whose parameters or fields the list records
    differences: dict[str, Difference]  # NeMo-RL's qualified name → how ours differs
    modules: dict[str, str]  # NeMo-RL's module → present / refused / missing

    def counts(self, rows: list[Row]) -> dict[str, int]:
        counted = Counter(self.categories[row] for row in rows)
        return {category: counted[category] for category in CATEGORIES}


@functools.cache
def coverage() -> Coverage:
    categories, differences, checked = {}, {}, 0
    for row in api_rows():
        category, obj = lookup(row)
        categories[row] = category
        if category == PRESENT and row.parameters:
            checked += 1
            problem = parameter_problem(row, obj)
            if problem is not None:
                differences[row.qualified] = problem
    modules = {row.module: _module_category(row.module) for row in api_rows()}
    return Coverage(categories, checked, differences, modules)


def _module_category(module: str) -> str:
    found = import_ours(module)
    return found if isinstance(found, str) else PRESENT


def groups() -> dict[str, list[Row]]:
    """The row groups docs/porting.md states counts for."""
    rows = api_rows()
    names = [row for row in rows if row.kind != "method"]
    return {
        "names": names,
        "`used_by` names": [row for row in names if row.used_by],
        "methods": [row for row in rows if row.kind == "method"],
    }


# docs/porting.md: "| names (944) | 150 | 120 | 669 | 5 |" (present, refused, missing, not NeMo-RL's),
# "| modules (203) | 60 | 40 | 103 | 0 |" (import, refused, missing) and "| signatures (300) | 200 | 60 | 20 | 20 |"
# (the same, extended, deliberately different, not yet matched).
_DOC_ROW = re.compile(
    r"^\| (names|`used_by` names|methods|modules|signatures) \((\d+)\) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|$"
)


def documented_counts() -> dict[str, tuple[int, ...]]:
    text = PORTING.read_text(encoding="utf-8")
    return {m[1]: tuple(int(n) for n in m.groups()[1:]) for m in map(_DOC_ROW.match, text.splitlines()) if m}


def computed_counts() -> dict[str, tuple[int, ...]]:
    found = coverage()
    table = {}
    for group, rows in groups().items():
        counts = found.counts(rows)
        table[group] = (len(rows), *(counts[category] for category in CATEGORIES))
    modules = Counter(found.modules.values())
    table["modules"] = (len(found.modules), modules[PRESENT], modules[REFUSED], modules[MISSING], 0)
    extended = sum(difference.extends for difference in found.differences.values())
    deliberate = sum(name in DELIBERATE for name in found.differences)
    unmatched = len(found.differences) - extended - deliberate
    table["signatures"] = (found.checked, found.checked - len(found.differences), extended, deliberate, unmatched)
    return table


def report() -> Iterator[str]:
    """The counts, then each category's rows by module, then the parameter differences."""
    found = coverage()
    for group, (total, *counts) in computed_counts().items():
        labels = SIGNATURE_CATEGORIES if group == "signatures" else CATEGORIES
        yield f"{group} ({total}): " + ", ".join(f"{n} {c}" for n, c in zip(counts, labels, strict=True))
    for category in (MISSING, REFUSED, NOT_NEMO_RL):
        yield f"\n{category}:"
        by_module: dict[str, list[str]] = {}
        for row, got in found.categories.items():
            if got == category:
                by_module.setdefault(row.module, []).append(row.name + ("*" if row.used_by else ""))
        yield from (f"  {module}: {', '.join(names)}" for module, names in sorted(by_module.items()))
    yield "\nparameters that differ (+ ours only extends NeMo-RL's, D deliberate, - not yet matched):"
    for name, difference in found.differences.items():
        mark = "+" if difference.extends else "D" if name in DELIBERATE else "-"
        yield f"  {mark} {name}: {difference.what}"


def _require_list() -> None:
    if not API_LIST.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"NeMo-RL v0.7.0's public-API list is not at {API_LIST} (CI must have ../shared)")
        pytest.skip(f"NeMo-RL v0.7.0's public-API list is not at {API_LIST}")


def test_the_documented_counts_are_the_computed_ones() -> None:
    _require_list()
    computed, documented = computed_counts(), documented_counts()
    print("\n".join(report()))
    assert documented == computed, (
        "docs/porting.md states other coverage counts than the list gives (update its table):\n"
        + "\n".join(
            f"| {group} ({total}) | {' | '.join(map(str, rest))} |" for group, (total, *rest) in computed.items()
        )
    )


def test_present_names_have_nemo_rl_parameters_or_a_listed_reason() -> None:
    _require_list()
    differences = {name: d.what for name, d in coverage().differences.items() if not d.extends}
    listed = set(DELIBERATE) | NOT_YET_MATCHED
    unlisted = {name: what for name, what in differences.items() if name not in listed}
    assert not unlisted, "parameters that differ from NeMo-RL's (match them, or list the reason in DELIBERATE):\n" + (
        "\n".join(f"{name}: {what}" for name, what in unlisted.items())
    )
    stale = sorted(listed - set(differences))
    assert not stale, f"listed as differing, but ours now takes every call NeMo-RL's takes (unlist them): {stale}"
    assert not set(DELIBERATE) & NOT_YET_MATCHED
    porting = PORTING.read_text(encoding="utf-8")
    undocumented = [name for name in DELIBERATE if f"`{name.removeprefix('nemo_rl.')}`" not in porting]
    assert not undocumented, f"docs/porting.md does not name these deliberate differences: {undocumented}"


def test_not_nemo_rl_names_are_rows_of_the_list() -> None:
    _require_list()
    qualified = {row.qualified for row in api_rows()}
    assert set(NOT_NEMO_RL_NAMES) <= qualified, sorted(set(NOT_NEMO_RL_NAMES) - qualified)


if __name__ == "__main__":
    print("\n".join(report()))
