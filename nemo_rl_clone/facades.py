"""The facade table: modules that exist only to present another module under a second path — NeMo-RL v0.7.0's path
(so that its users' imports read the same here) or an earlier path of ours (so that old imports keep working).

A facade may import any layer; nothing inside `nemo_rl_clone` imports one (it imports what the facade presents).
``tests/unit/test_import_layers.py`` holds both rules and reads this table; no module outside it is exempt.
"""

from __future__ import annotations

# facade module → the module it presents
FACADES: dict[str, str] = {
    # NeMo-RL's path (nemo_rl.algorithms.logits_sampling_utils)
    "nemo_rl_clone.algorithms.logits_sampling_utils": "nemo_rl_clone.contract.sampling",
    # NeMo-RL's path (nemo_rl.algorithms.loss.interfaces)
    "nemo_rl_clone.algorithms.loss.interfaces": "nemo_rl_clone.contract.loss",
    # NeMo-RL's path (nemo_rl.algorithms.loss.utils)
    "nemo_rl_clone.algorithms.loss.utils": "nemo_rl_clone.contract.loss_input",
    # our earlier path of the losses (now nemo_rl_clone.algorithms.loss, NeMo-RL's layout)
    "nemo_rl_clone.algorithms.loss_functions": "nemo_rl_clone.algorithms.loss",
    # our earlier path of the loss configs
    "nemo_rl_clone.algorithms.loss_configs": "nemo_rl_clone.algorithms.loss.configs",
    # our earlier path of the distillation loss
    "nemo_rl_clone.algorithms.distillation_loss": "nemo_rl_clone.algorithms.loss.distillation",
    # NeMo-RL's path (nemo_rl.experience.rollouts)
    "nemo_rl_clone.experience.rollouts": "nemo_rl_clone.rollout.multi_turn",
    # NeMo-RL's path (nemo_rl.algorithms.reward_functions)
    "nemo_rl_clone.algorithms.reward_functions": "nemo_rl_clone.rollout.rewards",
    # NeMo-RL's path (nemo_rl.utils.native_checkpoint)
    "nemo_rl_clone.utils.native_checkpoint": "nemo_rl_clone.models.dcp_checkpoint",
}
