"""A policy backend from outside the package: a worker class and its capability table, chosen from YAML by
``policy.backend: "tests.unit.policy_backend_plugin:PLUGIN_BACKEND"`` (test_policy_dtensor trains through it)."""

from __future__ import annotations

import dataclasses

from nemo_rl_clone.models.policy.backends import DTENSOR
from nemo_rl_clone.models.policy.dtensor.policy_worker import DTensorPolicyWorker

PLUGIN_PATH = f"{__name__}:PLUGIN_BACKEND"


class PluginPolicyWorker(DTensorPolicyWorker):
    """The DTensor worker under another class, so a test can tell which worker the `Policy` started."""

    def backend_name(self) -> str:
        return "plugin"


# Its own table: no sequence packing, so a config that packs is refused when the `Policy` builds.
PLUGIN_BACKEND = dataclasses.replace(
    DTENSOR, title="Plugin", worker=f"{__name__}.PluginPolicyWorker", sequence_packing=False
)
