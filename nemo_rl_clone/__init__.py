"""nemo_rl_clone: Ray-orchestrated RL post-training for LLMs."""

import os
from collections.abc import MutableMapping


def patch_transformers_module_dir(env_vars: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """NeMo-RL's helper: put ``$HF_HOME/modules`` (where transformers keeps a hub model's own code) first on
    ``env_vars["PYTHONPATH"]`` when ``HF_HOME`` is set and that folder exists; ``env_vars`` is changed in place and
    returned. Models here load without remote code, so nothing calls it on import (NeMo-RL patches ``os.environ``)."""
    hf_home = os.environ.get("HF_HOME")
    module_dir = os.path.join(hf_home, "modules") if hf_home else None
    if module_dir is None or not os.path.isdir(module_dir):
        return env_vars
    current = env_vars.get("PYTHONPATH")
    env_vars["PYTHONPATH"] = f"{module_dir}:{current}" if current else module_dir
    return env_vars
