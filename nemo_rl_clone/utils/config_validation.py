"""Validate a merged config against typed dataclass schemas.

NeMo-RL accepts any key, so a typo silently falls back to a default. Here every key of the merged config must exist
in the schema, have the declared type and pass the schema's own cross-field checks. All problems are collected and
reported together, one line each, naming the full dotted key.

Schema conventions:
- a schema is a dataclass; nested sections are dataclass-typed fields;
- supported field types: bool, int, float (ints accepted), str, Any, Optional[X], Union, Literal, list[X],
  tuple[X, ...], dict[str, X] and nested dataclasses;
- a dataclass may define ``check(self) -> list[tuple[str, str]]`` returning ``(relative_key, message)`` pairs for
  impossible combinations; it runs only when the section itself had no type errors;
- a section whose keys are open (``env``: one section per environment, named by the user) is a class with a
  classmethod ``convert_config(value, key, convert, problems)``; ``convert(value, type, dotted_key)`` validates a
  part of it by these same rules, and the classmethod appends its own problems (full lines) to ``problems``.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union

from nemo_rl_clone.utils.errors import report_uncaught_user_errors
from nemo_rl_clone.utils.unsupported_keys import refusal, refused_value

T = TypeVar("T")


class ConfigError(ValueError):
    """One or more problems in a config; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


def validate_config(data: Mapping[str, Any], schema: type[T], key: str = "") -> T:
    """Build ``schema`` from ``data`` (plain containers), raising :class:`ConfigError` with every problem found.
    ``key``: where ``data`` sits in a whole config (``checkpointing``), for the problems' keys and for NeMo-RL's keys
    of unbuilt features, which are named by their full path."""
    problems: list[str] = []
    result = _convert(data, schema, key, problems, _Context(schema))
    if problems:
        raise ConfigError(problems)
    return result


def as_config(config: Any, schema: type[T], key: str = "") -> T:
    """``config`` as a validated ``schema``: returned as is when it already is one; a plain mapping (NeMo-RL passes
    its master config and its sections as dicts) or an OmegaConf config is resolved and validated. ``key`` names the
    section for the problems (``checkpointing`` → ``checkpointing.keep_top_kk: unknown key``). A ``schema`` built
    from plain sections (NeMo-RL's ``MasterConfig(**config)``, whose scripts then edit the sections as dicts) is
    validated here too."""
    if isinstance(config, schema):
        if not _has_plain_sections(config):
            return config
        config = _plain(config)
    # NeMo-RL's scripts validate in their `setup()` call, outside any CLI of ours
    report_uncaught_user_errors(ConfigError)
    from omegaconf import DictConfig, OmegaConf  # lazy: validation itself does not need OmegaConf

    if isinstance(config, DictConfig):
        config = OmegaConf.to_container(config, resolve=True)
    if not isinstance(config, Mapping):
        where = f"{key} must be" if key else "expected"
        raise TypeError(f"{where} a {schema.__name__} or a mapping of its keys, got {type(config).__name__}")
    return validate_config(_plain(dict(config)), schema, key)


def takes_extra_keys(cls: type[T]) -> type[T]:
    """A master config that, like NeMo-RL's (a pydantic model with ``extra="allow"``), can be built from a whole YAML
    config, ``MasterConfig(**config)``, whatever its top-level keys. A key it does not know stays readable as an
    attribute and is refused, one line naming it, when the config is validated (`as_config`), not at construction
    with a ``TypeError``."""
    init = cls.__init__
    known = {field.name for field in dataclasses.fields(cls)}  # type: ignore[arg-type]

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        # A script's own flag read back as a key: NeMo-RL's run_eval.py merges OmegaConf.from_cli(), which keeps
        # "--config=<path>" beside the overrides (its pydantic config ignores it); the file is loaded already.
        kwargs = {key: value for key, value in kwargs.items() if not key.startswith("--")}
        extra = {key: kwargs.pop(key) for key in list(kwargs) if key not in known}
        init(self, *args, **kwargs)
        object.__setattr__(self, "_extra_keys", extra)
        for key, value in extra.items():
            object.__setattr__(self, key, value)

    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls


def config_to_dict(config: Any) -> dict[str, Any]:
    """A validated config (dataclass) as plain nested dicts and lists, e.g. for saving ``config.yaml``."""
    return _plain(dataclasses.asdict(config))


def _plain(value: Any) -> Any:
    # asdict keeps the types of mappings (the open `env` section is a dict subclass), which YAML cannot write.
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {field.name: _plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
        return fields | _plain(getattr(value, "_extra_keys", {}))
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def _has_plain_sections(config: Any) -> bool:
    """Whether a field of ``config`` that is a section (a dataclass, or an open section such as ``env``) holds a
    plain mapping instead."""
    if getattr(config, "_extra_keys", None):
        return True  # validation refuses them, naming each
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):
        value, tp = getattr(config, field.name), hints[field.name]
        section = _dataclass_in(tp) or (tp if isinstance(tp, type) and hasattr(tp, "convert_config") else None)
        if section is not None and isinstance(value, Mapping) and not isinstance(value, section):
            return True
    return False


class SectionReads:
    """NeMo-RL's reads of a config section, ``section["key"]``, ``section.get("key", default)`` and ``"key" in
    section``, on a typed section: NeMo-RL's sections are dicts, and code written for it reads the master config
    ``setup`` returns so (``master_config.policy["generation"]["max_new_tokens"]``). Every config section has them."""

    def __contains__(self, key: object) -> bool:
        section: Any = self  # a dataclass: the classes that mix this in are
        return any(field.name == key for field in dataclasses.fields(section))

    def __getitem__(self, key: str) -> Any:
        if key not in self:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in self else default


class _Context:
    """Everything needed to suggest the nearest valid key for an unknown one."""

    def __init__(self, root: type):
        self.all_keys = sorted(_dotted_keys(root, ""))

    def suggestion(self, dotted: str, siblings: list[str], prefix: str) -> str | None:
        leaf = dotted.rsplit(".", 1)[-1]
        close = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.6)
        if close:
            return _join(prefix, close[0])
        # Maybe the key was put in the wrong section: compare full paths, then leaf names anywhere.
        close = difflib.get_close_matches(dotted, self.all_keys, n=1, cutoff=0.75)
        if close:
            return close[0]
        by_leaf = {k.rsplit(".", 1)[-1]: k for k in self.all_keys}
        close = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.8)
        return by_leaf[close[0]] if close else None


def _dotted_keys(schema: type, prefix: str) -> set[str]:
    keys: set[str] = set()
    hints = typing.get_type_hints(schema)
    for field in dataclasses.fields(schema):
        key = _join(prefix, field.name)
        keys.add(key)
        inner = _dataclass_in(hints[field.name])
        if inner is not None:
            keys |= _dotted_keys(inner, key)
    return keys


def field_default(schema: type, dotted: str) -> tuple[Any, bool] | None:
    """``(default, accepts null)`` of the schema field at ``dotted`` (``a.b.c``); None when no field is there (an
    unknown key, or a key inside a ``dict``-typed field) or the field is required."""
    current: type | None = schema
    tp: Any = None
    field: dataclasses.Field | None = None
    for part in dotted.split("."):
        if current is None:
            return None
        fields = {f.name: f for f in dataclasses.fields(current)}
        if part not in fields:
            return None
        field, tp = fields[part], typing.get_type_hints(current)[part]
        current = _dataclass_in(tp)
    assert field is not None
    nullable = _is_union(tp) and type(None) in typing.get_args(tp)
    if field.default is not dataclasses.MISSING:
        return field.default, nullable
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory(), nullable
    return None


def _dataclass_in(tp: Any) -> type | None:
    """The dataclass inside ``tp`` (itself, or X of Optional[X]), if any."""
    for candidate in (tp, *typing.get_args(tp)) if _is_union(tp) else (tp,):
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
            return candidate
    return None


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _convert(value: Any, tp: Any, key: str, problems: list[str], ctx: _Context) -> Any:
    """Check ``value`` against type ``tp``; return the converted value (or None after recording a problem)."""
    if tp is Any:
        return value
    if isinstance(tp, type) and hasattr(tp, "convert_config"):
        return tp.convert_config(value, key, lambda v, t, k: _convert(v, t, k, problems, ctx), problems)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _convert_dataclass(value, tp, key, problems, ctx)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if _is_union(tp):
        if value is None and type(None) in args:
            return None
        for option in args:
            if option is type(None):
                continue
            trial: list[str] = []
            converted = _convert(value, option, key, trial, ctx)
            if not trial:
                return converted
        # Report the error of the one option of the value's shape (a section for a mapping, a list for a list)
        # directly: it reads better than a union listing.
        non_null = [a for a in args if a is not type(None)]
        shaped = [a for a in non_null if _same_shape(value, a)]
        if len(non_null) == 1 or len(shaped) == 1:
            return _convert(value, (shaped or non_null)[0], key, problems, ctx)
        problems.append(f"{key}: expected {_type_name(tp)}, got {_describe(value)}")
        return None
    if origin is Literal:
        if value not in args:
            allowed = ", ".join(repr(a) for a in args)
            problems.append(f"{key}: must be one of {allowed}, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            problems.append(f"{key}: expected a list, got {_describe(value)}")
            return None
        item_tp = args[0] if args else Any
        items = [_convert(v, item_tp, f"{key}[{i}]", problems, ctx) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            problems.append(f"{key}: expected a mapping, got {_describe(value)}")
            return None
        value_tp = args[1] if len(args) == 2 else Any
        return {k: _convert(v, value_tp, _join(key, k), problems, ctx) for k, v in value.items()}
    return _convert_scalar(value, tp, key, problems)


def _same_shape(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if isinstance(value, Mapping):
        return (isinstance(tp, type) and dataclasses.is_dataclass(tp)) or origin is dict or tp is dict
    if isinstance(value, (list, tuple)):
        return origin in (list, tuple)
    return False


def _convert_scalar(value: Any, tp: Any, key: str, problems: list[str]) -> Any:
    # bool is a subclass of int: `enabled: 1` or `lr: true` are almost always mistakes, so reject them.
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok:
            value = float(value)
    elif tp is str:
        if isinstance(value, os.PathLike):  # a path key given as a pathlib.Path (NeMo-RL takes either)
            value = os.fspath(value)
        ok = isinstance(value, str)
    else:
        ok = isinstance(value, tp)
    if not ok:
        problems.append(f"{key}: expected {_type_name(tp)}, got {_describe(value)}")
        return None
    return value


def _convert_dataclass(value: Any, tp: type, key: str, problems: list[str], ctx: _Context) -> Any:
    if not isinstance(value, Mapping):
        problems.append(f"{key or '<root>'}: expected a section (mapping), got {_describe(value)}")
        return None
    hints = typing.get_type_hints(tp)
    fields = {f.name: f for f in dataclasses.fields(tp)}
    for name in value:
        if name not in fields:
            dotted = _join(key, name)
            problem = refusal(dotted, value[name])  # NeMo-RL's keys of features not built here are named as such
            if problem is None or not problem.endswith(": unknown key"):
                problems += [problem] if problem else []
                continue
            near = ctx.suggestion(dotted, list(fields), key)
            hint = f" (did you mean {near}?)" if near else ""
            problems.append(f"{problem}{hint}")
    before = len(problems)
    kwargs: dict[str, Any] = {}
    for name, field in fields.items():
        dotted = _join(key, name)
        refused = refused_value(dotted, value[name]) if name in value else None
        if refused:
            problems.append(refused)
        elif name in value and refused is None:
            kwargs[name] = _convert(value[name], hints[name], dotted, problems, ctx)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            problems.append(f"{dotted}: missing required key ({_type_name(hints[name])})")
    if len(problems) > before:
        return None
    instance = tp(**kwargs)
    check = getattr(instance, "check", None)
    if callable(check):
        problems.extend(f"{_join(key, sub)}: {msg}" for sub, msg in check())
    return instance


def check_at_least(section: Any, minimum: float, *names: str) -> list[tuple[str, str]]:
    """``check()`` helper: a ``(key, "must be >= minimum, got v")`` problem for each named field below ``minimum``
    (a null field is not compared)."""
    return [
        (name, f"must be >= {minimum}, got {getattr(section, name)}")
        for name in names
        if getattr(section, name) is not None and getattr(section, name) < minimum
    ]


def check_port_range(low: int | None, high: int | None, key: str) -> list[tuple[str, str]]:
    """``check()`` helper for a ``*_low``/``*_high`` port pair: both null, or 1024 <= low <= high <= 65535."""
    if low is None and high is None:
        return []
    if low is None or high is None:
        return [(key, "set both ends of the port range, or neither")]
    if not 1024 <= low <= high <= 65535:
        return [(key, f"the port range must satisfy 1024 <= low <= high <= 65535, got {low}..{high}")]
    return []
