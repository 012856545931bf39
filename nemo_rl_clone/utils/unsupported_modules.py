"""Modules at NeMo-RL v0.7.0's paths for features this library does not build: importing one stops in one line.

Each such module (listed in `nemo_rl_clone.facades.REFUSED`) calls :func:`refuse_import` and nothing else; a module
that is built but has NeMo-RL names of such a feature refuses those names with :func:`refusing_getattr`. The error
is ``<module>: not supported yet: <feature>``, raised as :class:`UnsupportedFeatureError`, which is both an
``ImportError`` (a user's optional-import guard still catches it) and a `UserInputError` (an entry point reports it
as ``error: ...`` with exit code 2). Raised at the top of a user's own script, where no entry point reports it, it is
printed as that one line instead of a traceback (the script then exits with status 1, as any uncaught error does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NoReturn

from nemo_rl_clone.utils.errors import UserInputError, report_uncaught_user_errors


class UnsupportedFeatureError(UserInputError, ImportError):
    """A module of NeMo-RL's for a feature this library does not build was imported."""


def refuse_import(module: str, feature: str) -> NoReturn:
    """Stop the import of ``module`` (the caller's ``__name__``) with one line naming ``feature``."""
    report_uncaught_user_errors()
    error = UnsupportedFeatureError(f"{module}: not supported yet: {feature}")
    error.name = module  # ImportError's attribute: the module that could not be imported
    raise error


def refusing_getattr(module: str, refused: Mapping[str, str]) -> Callable[[str], NoReturn]:
    """A module-level ``__getattr__`` for ``module`` (the caller's ``__name__``): each name of ``refused`` (name →
    feature), a NeMo-RL name of an unbuilt feature in a module that is otherwise built, stops with one line as
    :func:`refuse_import` does; any other unknown name is the usual ``AttributeError``."""

    def module_getattr(name: str) -> NoReturn:
        if name in refused:
            refuse_import(f"{module}.{name}", refused[name])
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return module_getattr
