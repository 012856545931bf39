"""Objects a config names by dotted path: optimizer and scheduler classes, environment classes, parallel plans."""

from __future__ import annotations

import difflib
import importlib
from typing import Any


def import_by_path(path: str) -> Any:
    """The object at ``"package.module.Name"``; ImportError naming the path, and the nearest name in the module."""
    module_path, _, name = path.rpartition(".")
    if not module_path:
        raise ImportError(f"{path!r} is not a dotted class path (package.module.Class)")
    try:
        module = importlib.import_module(module_path)
    except ImportError as error:
        raise ImportError(f"cannot import {path!r} (module {module_path!r}: {error})") from None
    if hasattr(module, name):
        return getattr(module, name)
    close = difflib.get_close_matches(name, [n for n in dir(module) if not n.startswith("_")], n=1)
    hint = f" (did you mean {module_path}.{close[0]}?)" if close else ""
    raise ImportError(f"cannot import {path!r}{hint}")
