"""The one registry shape every plug-in kind uses (nemo_rl_clone.utils.registry)."""

import pytest

from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.utils.registry import Registry, is_import_path


def test_names_paths_and_objects_resolve():
    registry: Registry[object] = Registry("widget", "widget.name")
    registry.register("dumps", "json:dumps")
    registry.register("thing", len)
    import json

    assert registry.resolve("dumps") is json.dumps
    assert registry.resolve("thing") is len
    assert registry.resolve("json:loads") is json.loads  # an import path needs no registration
    assert registry.names() == ["dumps", "thing"] and "thing" in registry


def test_unknown_names_and_bad_paths_are_one_line_naming_the_key():
    registry: Registry[object] = Registry("widget", "widget.name")
    registry.register("dumps", "json:dumps")
    with pytest.raises(UserInputError, match=r"^widget.name: unknown widget 'dump' \(did you mean 'dumps'\?\)"):
        registry.check("dump")
    with pytest.raises(UserInputError, match=r"^other.key: cannot import module 'no_such_mod'"):
        registry.resolve("no_such_mod:thing", key="other.key")
    with pytest.raises(UserInputError, match=r"did you mean json:load"):
        registry.resolve("json:loadz")
    with pytest.raises(ValueError):
        registry.register("bad", "json.dumps")
    assert not is_import_path("json.dumps") and is_import_path("a.b:C")
