"""One shape for every plug-in kind (algorithm, policy backend, generation backend, loss, advantage estimator,
environment): a YAML value is a registered name or an import path ``"package.module:attribute"``, resolved here.

    LOSSES = Registry("loss", "loss_fn.name")
    LOSSES.register("clipped_pg", "nemo_rl_clone.algorithms.loss.loss_functions:ClippedPGLossFn")
    LOSSES.check(value)          # at config validation: one line naming the key, nothing imported
    LOSSES.resolve(value)        # when the run builds it: the object (imported on first use)

An entry may be the object itself or its ``"module:attribute"`` path; a path costs nothing until a run uses it, so
registering never loads torch or a backend's heavy imports, and a module may register entries defined above it.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from nemo_rl_clone.utils.errors import UserInputError

T = TypeVar("T")


def is_import_path(value: str) -> bool:
    """``"package.module:attribute"``: how a YAML value names a plug-in that is not registered."""
    module, sep, attribute = value.partition(":")
    return bool(sep and module and attribute.isidentifier())


def load_import_path(path: str, key: str) -> Any:
    """The object at ``"package.module:attribute"``; a `UserInputError` naming ``key`` when it cannot be imported."""
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise UserInputError(f"{key}: cannot import module {module_name!r} of {path!r} ({error})") from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        public = [n for n in dir(module) if not n.startswith("_")]
        close = difflib.get_close_matches(attribute, public, n=1)
        hint = f" (did you mean {module_name}:{close[0]}?)" if close else ""
        raise UserInputError(f"{key}: module {module_name!r} has no {attribute!r}{hint}") from None


class Registry(Generic[T]):
    """The plug-ins of one ``kind``, chosen by config key ``key``."""

    def __init__(self, kind: str, key: str) -> None:
        self.kind = kind
        self.key = key
        self._entries: dict[str, T | str] = {}

    def register(self, name: str, target: T | str) -> None:
        """Add (or replace) ``name``; a string ``target`` is a ``"module:attribute"`` path imported on first use."""
        if isinstance(target, str) and not is_import_path(target):
            raise ValueError(f"{self.kind} {name!r}: {target!r} is not 'package.module:attribute'")
        self._entries[name] = target

    def unregister(self, name: str) -> None:
        """Drop ``name`` (a plug-in a test registered, once the test is done)."""
        self._entries.pop(name, None)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def problem(self, value: str, key: str | None = None) -> str | None:
        """Why ``value`` names no plug-in (one line naming the key), or None; imports nothing."""
        if value in self._entries or is_import_path(value):
            return None
        close = difflib.get_close_matches(value, self.names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return (
            f"{key or self.key}: unknown {self.kind} {value!r}{hint}; registered: {', '.join(self.names())}, "
            "or an import path 'package.module:attribute'"
        )

    def check(self, value: str, key: str | None = None) -> None:
        """Raise the `problem` of ``value`` as a `UserInputError`."""
        problem = self.problem(value, key)
        if problem:
            raise UserInputError(problem)

    def resolve(self, value: str, key: str | None = None) -> T:
        """The plug-in ``value`` names: a registered name, or an import path loaded now."""
        self.check(value, key)
        entry = self._entries.get(value, value)
        if isinstance(entry, str):
            resolved: T = load_import_path(entry, key or self.key)
            return resolved
        return entry
