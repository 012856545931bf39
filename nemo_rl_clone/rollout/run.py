"""A rollout-based run's parts (`RolloutRun`): what the rollout machinery and every algorithm on it use. The
algorithm's setup builds it (`nemo_rl_clone.algorithms.run.rollout.setup_rollout_run`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from nemo_rl_clone.data.dataloader import StatefulPromptLoader
from nemo_rl_clone.data.datasets.common import AllTaskProcessedDataset
from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl_clone.models.generation.interfaces import GenerationInterface
from nemo_rl_clone.models.policy.lm_policy import Policy
from nemo_rl_clone.rollout.config import RolloutRunConfig
from nemo_rl_clone.utils.checkpoint import CheckpointManager
from nemo_rl_clone.utils.logger import Logger

ConfigT = TypeVar("ConfigT", bound=RolloutRunConfig)


@dataclass
class RolloutRun(Generic[ConfigT]):
    config: ConfigT
    tokenizer: Any
    policy: Policy
    generation: GenerationInterface
    dataloader: StatefulPromptLoader
    val_dataset: AllTaskProcessedDataset | None
    task_to_env: dict[str, Any]
    loss_fn: Any  # the policy's loss (`nemo_rl_clone.contract.loss.LossFunction`)
    logger: Logger
    checkpointer: CheckpointManager
    state: Any  # the run's checkpointed state (`nemo_rl_clone.algorithms.run.state.RunState`)
    colocated: bool
    log_dir: Path
    clusters: list[RayVirtualCluster]

    def shutdown(self) -> None:
        import ray

        self.generation.shutdown()
        self.policy.shutdown()
        for env in self.task_to_env.values():
            ray.kill(env)
        for cluster in self.clusters:
            cluster.shutdown()
        self.logger.finish()
