"""A policy backend from outside the package: a worker class and its capability table, chosen from YAML by
``policy.backend: "tests.unit.policy_backend_plugin:PLUGIN_BACKEND"`` (test_policy_dtensor trains through it).
The table imports nothing heavy: the worker (`policy_backend_plugin_worker`) is imported when a `Policy` starts."""

from __future__ import annotations

import dataclasses

from nemo_rl_clone.models.policy.backends import DTENSOR

PLUGIN_PATH = f"{__name__}:PLUGIN_BACKEND"

# Its own table: no sequence packing, so a config that packs is refused when the `Policy` builds.
PLUGIN_BACKEND = dataclasses.replace(
    DTENSOR,
    title="Plugin",
    worker="tests.unit.policy_backend_plugin_worker.PluginPolicyWorker",
    sequence_packing=False,
)
