"""NeMo-RL v0.7.0's path of the actor-environment lookup (``nemo_rl.distributed.ray_actor_environment_registry``);
the code is `nemo_rl_clone.distributed.ray_actor_environment`. A facade (`nemo_rl_clone.facades`): nothing inside the
package imports it."""

from nemo_rl_clone.distributed.ray_actor_environment import get_actor_python_env

__all__ = ["get_actor_python_env"]
