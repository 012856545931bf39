"""Every config key, from the schemas themselves: its type, default, allowed values, what it does, the algorithms
that read it and whether it is built. docs/config_reference.md is this script's output (a test fails when they
differ), and ``explain`` prints one key.

    uv run examples/config_reference.py explain grpo.adv_estimator.std     # one key (or a whole section)
    uv run examples/config_reference.py write                              # regenerate docs/config_reference.md

"What it does" is the comment the schema gives the field (beside it or on the lines above it), else the first
sentence of its section's docstring. Keys of NeMo-RL's recipes for features not built here are listed too, as
"not supported yet" with the values that leave them off: a recipe may set them at those values.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import io
import re
import sys
import textwrap
import tokenize
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from nemo_rl_clone.algorithms.registry import algorithm_names, config_class
from nemo_rl_clone.evals.config import EvalMasterConfig
from nemo_rl_clone.utils.unsupported_keys import UNSUPPORTED_KEYS

PAGE = Path(__file__).resolve().parents[1] / "docs" / "config_reference.md"
_NO_COMMENT = "(no description of its own"
# The run each master config is read by (its algorithm section's name): the registered algorithms, and evaluation.
MASTERS: dict[str, type] = {**{name: config_class(name) for name in algorithm_names()}, "eval": EvalMasterConfig}


@dataclass
class KeyRow:
    key: str
    type: str
    default: str
    allowed: str
    what: str
    algorithms: list[str] = field(default_factory=list)
    built: str = "yes"
    defaults: dict[str, str] = field(default_factory=dict)  # per reading run, where they differ

    def __post_init__(self) -> None:
        if self.default:
            self.defaults = dict.fromkeys(self.algorithms, self.default)

    @property
    def default_text(self) -> str:
        values = set(self.defaults.values())
        if len(values) <= 1:
            return next(iter(values), "")
        return "; ".join(f"{run}: {value}" for run, value in self.defaults.items())


def _is_dataclass_type(tp: Any) -> type | None:
    for candidate in (tp, *typing.get_args(tp)):
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
            return candidate
    return None


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    if isinstance(tp, type):
        return tp.__name__
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of the allowed values"
    if origin in (typing.Union, __import__("types").UnionType):
        return " | ".join(_type_name(arg) for arg in args)
    if origin is not None:
        inner = ", ".join(_type_name(arg) for arg in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    return str(tp).replace("typing.", "")


def _allowed(tp: Any) -> str:
    values = [
        v for arg in (tp, *typing.get_args(tp)) if typing.get_origin(arg) is Literal for v in typing.get_args(arg)
    ]
    return ", ".join(f"`{v}`" for v in values)


def _value(value: Any) -> str:
    return "null" if value is None else f"`{str(value).lower()}`" if isinstance(value, bool) else f"`{value!r}`"


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return _value(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return _value(f.default_factory())
    return "required"


@functools.cache
def _field_comments(cls: type) -> dict[str, str]:
    """Each field's comment in the class source: the lines of comment right above it, then the one beside it."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    comments = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    found: dict[str, str] = {}
    node = ast.parse(source).body[0]
    for item in getattr(node, "body", []):
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        above, line = [], item.lineno - 1
        while line in comments and lines[line - 1].lstrip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        beside = [comments[n] for n in range(item.lineno, (item.end_lineno or item.lineno) + 1) if n in comments]
        text = " ".join(above + beside).strip()
        if text:
            found[item.target.id] = text
    return found


def _docstring_sentence(cls: type, name: str) -> str:
    """The sentence of the section's docstring (or a base's) that names ``name`` in backquotes, if one does."""
    for base in cls.__mro__:
        doc = " ".join((inspect.getdoc(base) or "").split()) if dataclasses.is_dataclass(base) else ""
        for sentence in re.split(r"(?<=\.)\s+(?=[A-Z`(])", doc):
            if re.search(rf"`{re.escape(name)}`", sentence):
                return sentence
    return ""


def _summary(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    first = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    return first.split(". ")[0].rstrip(".") + "." if first else ""


def _comments_with_bases(cls: type) -> dict[str, str]:
    """`_field_comments` of ``cls`` and of the classes it inherits fields from (its own win)."""
    merged: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base):
            merged.update(_field_comments(base))
    return merged


def _walk(cls: type, prefix: str, algorithm: str, rows: dict[str, KeyRow], seen: set[type]) -> None:
    hints = typing.get_type_hints(cls)
    comments = _comments_with_bases(cls)
    for f in dataclasses.fields(cls):
        if f.name.startswith("_"):
            continue
        key = f"{prefix}{f.name}"
        tp = hints.get(f.name, Any)
        inner = _is_dataclass_type(tp)
        if inner is not None and inner not in seen:
            _walk(inner, f"{key}.", algorithm, rows, seen | {inner})
            continue
        what = (
            comments.get(f.name) or _docstring_sentence(cls, f.name) or f"{_NO_COMMENT}; its section: {_summary(cls)})"
        )
        row = rows.setdefault(key, KeyRow(key, _type_name(tp), "", _allowed(tp), what))
        if algorithm not in row.algorithms:
            row.algorithms.append(algorithm)
            row.defaults[algorithm] = _default(f)


def reference_rows() -> list[KeyRow]:
    """One row per key of every master config (and per NeMo-RL key refused by name), sorted by key."""
    rows: dict[str, KeyRow] = {}
    for algorithm, master in MASTERS.items():
        _walk(master, "", algorithm, rows, {master})
    for pattern, unsupported in UNSUPPORTED_KEYS.items():
        key = pattern.replace("*", "…")
        if key not in rows:
            inert = ", ".join(_value(v) for v in unsupported.inert)
            accepted = f"only {inert} (off)" if inert else "none (refused whenever set)"
            rows[key] = KeyRow(key, "", "", accepted, unsupported.what, ["any"], built="not supported yet")
    return sorted(rows.values(), key=lambda row: row.key)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(rows: list[KeyRow]) -> str:
    head = (
        "# Config reference\n\n"
        "Generated from the config schemas by `uv run examples/config_reference.py write` (a test fails when this page "
        "and the schemas disagree); `uv run examples/config_reference.py explain KEY` prints one key or section. Keys "
        "are NeMo-RL v0.7.0's names; where a key's meaning differs from NeMo-RL's, its description says so. *Built*: "
        "`yes`, or `not supported yet` for a NeMo-RL key whose feature is not built here (a recipe may set it to the "
        "listed values, which leave the feature off; any other value stops the run at validation with one line; `…` "
        "stands for any section). "
        "Checks that span keys (and values refused for a key that is otherwise built) are listed in "
        "[configs](configs.md).\n\n"
        f"{len(rows)} keys; {sum(not r.what.startswith(_NO_COMMENT) for r in rows)} are described by their schema's own "
        "comment or docstring sentence, the others only by their section's summary (each comment added to a schema "
        "fills its row here).\n\n"
        "| key | type | default | allowed values | what it does | read by | built |\n"
        "| --- | --- | --- | --- | --- | --- | --- |\n"
    )
    body = "".join(
        f"| `{r.key}` | {_cell(r.type)} | {_cell(r.default_text)} | {_cell(r.allowed)} | {_cell(r.what)} | "
        f"{', '.join(r.algorithms)} | {r.built} |\n"
        for r in rows
    )
    return head + body


def explain(key: str, rows: list[KeyRow]) -> str:
    """The row of ``key``, or every row under ``key.`` (a section); a one-line miss naming the closest keys."""
    hits = [r for r in rows if r.key == key or r.key.startswith(f"{key}.")]
    if not hits:
        import difflib

        close = difflib.get_close_matches(key, [r.key for r in rows], n=3, cutoff=0.6)
        raise SystemExit(f"error: no config key {key!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    blocks = []
    for r in hits:
        lines = [r.key, f"  what it does: {r.what}"]
        lines += [f"  type: {r.type}"] if r.type else []
        lines += [f"  default: {r.default_text}"] if r.default_text else []
        lines += [f"  allowed values: {r.allowed}"] if r.allowed else []
        lines += [f"  read by: {', '.join(r.algorithms)}", f"  built: {r.built}"]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("explain", help="print one key, or every key of a section").add_argument("key")
    commands.add_parser("write", help=f"regenerate {PAGE.relative_to(PAGE.parents[1])}")
    args = parser.parse_args(argv)
    rows = reference_rows()
    if args.command == "explain":
        print(explain(args.key, rows))
    else:
        PAGE.write_text(render(rows))
        print(f"wrote {PAGE} ({len(rows)} keys)")


if __name__ == "__main__":
    sys.exit(main())
