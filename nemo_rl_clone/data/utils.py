"""NeMo-RL v0.7.0's path of its data setup functions (``nemo_rl.data.utils``); the code is
`nemo_rl_clone.algorithms.run.nemo_rl_data` (it starts environments, which the data layer may not import). A facade
(`nemo_rl_clone.facades`): nothing inside the package imports it."""

from nemo_rl_clone.algorithms.run.nemo_rl_data import (
    get_train_dataset_name,
    load_dataloader_state,
    setup_preference_data,
    setup_response_data,
)

__all__ = ["get_train_dataset_name", "load_dataloader_state", "setup_preference_data", "setup_response_data"]
