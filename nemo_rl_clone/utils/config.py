"""YAML configs: ``defaults:`` inheritance, hydra-style CLI overrides, typed validation, and the example CLI.

    uv run examples/run_grpo_math.py --config configs/grpo_math_1B.yaml grpo.num_prompts_per_step=8 ++logger.wandb_enabled=true

Override forms: ``a.b=v`` (the key must exist), ``+a.b=v`` (add a new key), ``++a.b=v`` (add or override),
``~a.b`` (delete). Values are parsed as YAML scalars or lists (``[1, 2]``, ``null``, ``true``, ``1e-6``).

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
from typing import Any, TypeVar, cast

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nemo_rl_clone.utils.config_validation import ConfigError, field_default, validate_config

T = TypeVar("T")

# NeMo-RL's arithmetic resolvers, e.g. ``${mul:${policy.max_total_sequence_length}, 2}`` (``div`` is true division).
for _name, _op in {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "max": lambda a, b: max(a, b),
}.items():
    OmegaConf.register_resolver(_name, _op, replace=True)


def load_config(path: str | Path) -> DictConfig:
    """Load a YAML file, merging the files named by its ``defaults:`` key (string or list) first.

    Default paths are relative to the file naming them, resolved depth-first; later files win and the file itself
    wins over all of its defaults.
    """
    return _load(Path(path).resolve(), ())


def _load(path: Path, chain: tuple[Path, ...]) -> DictConfig:
    if path in chain:
        cycle = " -> ".join(p.name for p in (*chain, path))
        raise ConfigError([f"defaults: inheritance cycle {cycle}"])
    if not path.is_file():
        named_by = f" (named in defaults of {chain[-1]})" if chain else ""
        raise ConfigError([f"config file not found: {path}{named_by}"])
    try:
        cfg = OmegaConf.load(path)
    except (yaml.YAMLError, OmegaConfBaseException) as exc:
        first_line = str(exc).strip().splitlines()[0]
        raise ConfigError([f"{path}: invalid YAML: {first_line}"]) from None
    if not isinstance(cfg, DictConfig):
        raise ConfigError([f"{path}: top level must be a mapping, got a list"])
    defaults = cfg.pop("defaults", None)
    if defaults is None:
        return cfg
    if isinstance(defaults, str):
        defaults = [defaults]
    elif not isinstance(defaults, ListConfig) or not all(isinstance(d, str) for d in defaults):
        raise ConfigError([f"{path}: defaults must be a path or a list of paths"])
    merged = OmegaConf.create()
    for default in defaults:
        merged = cast(DictConfig, OmegaConf.merge(merged, _load((path.parent / default).resolve(), (*chain, path))))
    return cast(DictConfig, OmegaConf.merge(merged, cfg))  # merging mappings gives a mapping


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
    cfg = apply_overrides(load_config(config_path), overrides, schema)
    return validate_config(resolve_to_container(cfg), schema)


def parse_cli_args(
    argv: Sequence[str] | None, default_config: str | Path, description: str = ""
) -> tuple[Path, list[str]]:
    """``[--config PATH] [override ...]`` → (config path, overrides)."""
    parser = argparse.ArgumentParser(
        description=description,
        epilog="overrides: a.b=v (existing key), +a.b=v (new key), ++a.b=v (add or override), ~a.b (delete; a key "
        "with a non-null default is refused: set it, or =null)",
    )
    parser.add_argument(
        "--config", type=Path, default=Path(default_config), help=f"YAML config (default: {default_config})"
    )
    args, overrides = parser.parse_known_args(argv)
    flags = [o for o in overrides if o.startswith("-")]
    if flags:
        parser.error(f"unrecognized arguments: {' '.join(flags)}")
    return args.config, overrides


def load_config_from_cli(
    schema: type[T], default_config: str | Path, argv: Sequence[str] | None = None, description: str = ""
) -> T:
    """The whole CLI front door of the examples: parse, load, override, validate; exit 2 with one line per problem."""
    config_path, overrides = parse_cli_args(argv, default_config, description)
    try:
        return load_validated_config(config_path, overrides, schema)
    except ConfigError as err:
        print(f"Invalid config ({len(err.problems)} problem{'s' if len(err.problems) > 1 else ''}):", file=sys.stderr)
        for problem in err.problems:
            print(f"  {problem}", file=sys.stderr)
        raise SystemExit(2) from None


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
