"""`TQDataPlaneClient`: the data plane on TransferQueue (PyPI ``transferqueue``), its "simple" storage backend.

The driver (``bootstrap=True``) starts TransferQueue's controller and ``data_plane.num_storage_units`` storage
units as Ray actors, spread round-robin over the cluster's nodes; every other process (``bootstrap=False``) finds
them by name and connects a client. They are started here rather than by ``transfer_queue.init`` so that they ask
Ray for no CPU: TransferQueue's own start asks one CPU per actor, which a cluster whose CPUs are all reserved for
worker bundles (every CPU run here) never grants, and the run would wait forever.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Any, cast

import ray
import torch

from nemo_rl_clone.data_plane.interfaces import DataPlaneClient
from nemo_rl_clone.utils.errors import UserInputError

logger = logging.getLogger(__name__)

# TransferQueue logs a notice on every read whose thread budget exceeds a 2-core machine's; its errors still show.
_LOG_LEVEL = "ERROR"
# TransferQueue finds its controller under this name (transfer_queue.interface).
CONTROLLER_NAME, CONTROLLER_NAMESPACE = "TransferQueueController", "transfer_queue"


class TQDataPlaneClient(DataPlaneClient):
    """A process's TransferQueue client; with ``bootstrap`` this process also starts (and at `close` stops) the
    queue's actors. ``cfg``: the ``data_plane`` section (a mapping or `DataPlaneConfig`)."""

    def __init__(self, cfg: Any, *, bootstrap: bool = True) -> None:
        os.environ.setdefault("TQ_LOGGING_LEVEL", _LOG_LEVEL)  # read at import: per-call thread-count notices
        import transfer_queue as tq  # imported only by runs that use the data plane

        self._tq = tq
        self._owner = bootstrap
        self._finish_start: Callable[[], None] | None = None
        if bootstrap:
            self._finish_start = _start_queue(_get(cfg, "num_storage_units"), _get(cfg, "storage_capacity"))
        else:
            tq.init()  # finds the controller the driver started and connects a client from its stored config

    def wait_until_started(self) -> None:
        """Return once the queue's actors run (the driver's client starts them without waiting, so that they start
        beside the policy workers and engines)."""
        if self._finish_start is not None:
            self._finish_start()
            self._finish_start = None

    def put_samples(
        self,
        sample_ids: Sequence[str],
        partition_id: str,
        fields: Mapping[str, torch.Tensor] | None = None,
        tags: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        from tensordict import TensorDict

        self.wait_until_started()
        columns = TensorDict(dict(fields), batch_size=[len(sample_ids)]) if fields else None
        self._tq.kv_batch_put(
            keys=list(sample_ids),
            partition_id=partition_id,
            fields=columns,
            tags=[dict(tag) for tag in tags] if tags else None,
        )

    def get_samples(
        self, sample_ids: Sequence[str], partition_id: str, select_fields: Sequence[str]
    ) -> dict[str, torch.Tensor]:
        self.wait_until_started()
        columns = self._tq.kv_batch_get(
            keys=list(sample_ids), partition_id=partition_id, select_fields=list(select_fields)
        )
        return {name: _dense(name, columns[name]) for name in select_fields}

    def clear_samples(self, sample_ids: Sequence[str], partition_id: str) -> None:
        if sample_ids:
            self._tq.kv_clear(keys=list(sample_ids), partition_id=partition_id)

    def close(self) -> None:
        if self._owner:
            self._tq.close()  # stops the storage units and the controller this process started
        else:
            client = self._tq.interface._TQ_CLIENT
            if client is not None:
                client.close()
                self._tq.interface._TQ_CLIENT = None


def _get(cfg: Any, key: str) -> Any:
    return cfg[key] if isinstance(cfg, Mapping) else getattr(cfg, key)


def _dense(name: str, value: Any) -> torch.Tensor:
    """TransferQueue hands rows back as a nested (jagged) tensor; rows written at one padded width stack again."""
    if not getattr(value, "is_nested", False):
        return value
    rows = value.unbind()
    shapes = {tuple(row.shape) for row in rows}
    if len(shapes) != 1:
        raise ValueError(
            f"data plane: field {name!r} came back with rows of shapes {sorted(shapes)}; rows are written at one width"
        )
    return torch.stack(rows)


def _start_queue(num_storage_units: int, storage_capacity: int) -> Callable[[], None]:
    """Start TransferQueue's controller and simple storage units, each asking Ray for no CPU; returns what waits for
    them and connects this process's client."""
    from omegaconf import OmegaConf
    from transfer_queue import interface
    from transfer_queue.controller import TransferQueueController
    from transfer_queue.sampler import SequentialSampler
    from transfer_queue.storage.simple_storage import SimpleStorageUnit
    from transfer_queue.utils.common import get_node_round_robin_scheduling_strategies
    from transfer_queue.utils.zmq_utils import process_zmq_server_info

    try:
        ray.get_actor(CONTROLLER_NAME, namespace=CONTROLLER_NAMESPACE)
    except ValueError:
        pass
    else:
        raise UserInputError(
            "data_plane.enabled: a TransferQueue controller already runs on this Ray cluster (another run's); one "
            "run with the data plane per cluster at a time"
        )
    quiet = {"env_vars": {"TQ_LOGGING_LEVEL": os.environ["TQ_LOGGING_LEVEL"]}}
    conf = OmegaConf.merge(
        OmegaConf.create({}, flags={"allow_objects": True}),
        OmegaConf.load(str(resources.files("transfer_queue") / "config.yaml")),
    )
    conf.backend.storage_backend = "SimpleStorage"
    storage_conf = conf.backend.SimpleStorage
    storage_conf.num_data_storage_units = num_storage_units
    storage_conf.total_storage_size = storage_capacity
    controller = TransferQueueController.options(
        name=CONTROLLER_NAME, namespace=CONTROLLER_NAMESPACE, num_cpus=0, runtime_env=quiet
    ).remote(sampler=SequentialSampler(), polling_mode=False)
    unit_config = {**cast(dict[str, Any], OmegaConf.to_container(storage_conf)), "_run_id": uuid.uuid4().hex}
    units = {}
    for rank, strategy in enumerate(get_node_round_robin_scheduling_strategies(num_storage_units)):
        name = f"TransferQueueStorageUnit#{rank}"
        units[name] = SimpleStorageUnit.options(
            name=name, num_cpus=0, scheduling_strategy=strategy, runtime_env=quiet
        ).remote(config=unit_config)
    # TransferQueue's module state, as its own start leaves it: `transfer_queue.close` then stops these actors.
    interface._TQ_CONTROLLER = controller
    interface._TQ_STORAGE = {"SimpleStorage": units}

    def finish() -> None:
        conf.controller.zmq_info = process_zmq_server_info(controller)
        storage_conf.zmq_info = process_zmq_server_info(units)
        ray.get(controller.store_config.remote(conf))
        interface._maybe_create_tq_client(conf)
        logger.info("data plane: TransferQueue with %d storage units", num_storage_units)

    return finish
