"""The worker of `tests.unit.policy_backend_plugin`'s backend."""

from __future__ import annotations

from nemo_rl_clone.models.policy.dtensor.policy_worker import DTensorPolicyWorker


class PluginPolicyWorker(DTensorPolicyWorker):
    """The DTensor worker under another class, so a test can tell which worker the `Policy` started."""

    def backend_name(self) -> str:
        return "plugin"
