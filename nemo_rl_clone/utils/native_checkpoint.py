"""NeMo-RL v0.7.0's path of the DCP checkpoint helpers (``nemo_rl.utils.native_checkpoint``); the code is
`nemo_rl_clone.models.dcp_checkpoint`. A facade (`nemo_rl_clone.facades`): nothing inside the package imports it."""

from nemo_rl_clone.models.dcp_checkpoint import (
    ModelState,
    OptimizerState,
    convert_dcp_to_hf,
    load_checkpoint,
    save_checkpoint,
)

__all__ = ["ModelState", "OptimizerState", "convert_dcp_to_hf", "load_checkpoint", "save_checkpoint"]
