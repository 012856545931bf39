"""Weight sync (refit): the one place where the training policy and the generation engines meet.

Two ways, chosen by ``policy.generation.colocated.enabled``:

- colocated (same bundles, time-shared): the trainer frees what it can (`offload_before_refit`), the engines
  re-acquire their weight memory (GPU: wake ``["weights"]``), train rank 0 hands over the full Hugging Face-named
  state dict through Ray's object store (host memory, no disk), the engines load it, the trainer releases its
  weights (`offload_after_refit`) and the engines re-acquire their KV cache. On CPU the memory calls do nothing:
  vLLM has no sleep mode there and everything stays resident in RAM.
- non-colocated (separate bundles): train rank 0 broadcasts the weights over a stand-alone gloo (CPU) / NCCL (GPU)
  group to every engine in size-bounded buckets (`nemo_rl_clone.distributed.weight_transfer`); the group is built
  once with `init_refit_collective`.

Either way the engines check the new weights completely before loading them and reset their prefix cache after;
a refit that fails before loading raises `RefitError` and leaves the previous weights serving.

    prepare_refit(policy, generation)                        # once, after both are built
    init_refit_collective(policy, generation, train_cluster) # once, non-colocated only
    refit_policy_generation(policy, generation, colocated, timer=timer)  # whenever the weights are stale
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

import ray

from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl_clone.distributed.weight_transfer import DEFAULT_BUCKET_BYTES, DEFAULT_TIMEOUT_S, WeightTransferError
from nemo_rl_clone.models.generation.interfaces import GenerationInterface, RefitError
from nemo_rl_clone.utils.timer import Timer

logger = logging.getLogger(__name__)

TIMER_LABEL = "weight_sync"  # → timing/train/weight_sync
_DRAIN_AFTER_FAILURE_S = 60.0


class RefitSourcePolicy(Protocol):
    """What a refit needs from a policy (`ColocatablePolicyInterface` plus the collective methods)."""

    def prepare_refit_info(self) -> dict[str, Any]: ...
    def offload_before_refit(self) -> None: ...
    def offload_after_refit(self) -> None: ...
    def get_full_state_dict_for_refit(self) -> dict[str, Any]: ...
    # Optional, faster: rank 0's `weight_transfer.pack_tensors(full state dict)` left in the object store.
    # def get_packed_state_dict_ref_for_refit(self) -> ray.ObjectRef: ...
    def init_collective(
        self, ip: str, port: int, world_size: int, /, *, timeout_s: float = ...
    ) -> list[ray.ObjectRef]: ...
    def broadcast_weights_for_collective(self, *, bucket_bytes: int = ...) -> list[ray.ObjectRef]: ...


def prepare_refit(policy: RefitSourcePolicy, generation: GenerationInterface) -> None:
    """Tell the engines what the policy will send; raises `RefitError` if it does not fit their model."""
    if _samples_with_policy_weights(generation):
        return
    generation.prepare_refit_info(policy.prepare_refit_info())


def _samples_with_policy_weights(generation: GenerationInterface) -> bool:
    """A backend whose workers are the policy's (``backend: megatron``): there is nothing to send."""
    return bool(getattr(generation, "shares_policy_weights", False))


def init_refit_collective(
    policy: RefitSourcePolicy,
    generation: GenerationInterface,
    train_cluster: RayVirtualCluster,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> None:
    """Build the transfer group: train rank 0 (member 0, hosting the store on its node) + every engine."""
    if _samples_with_policy_weights(generation):
        return
    address, port = train_cluster.get_master_address_and_port()
    world_size = 1 + generation.dp_size
    futures = policy.init_collective(address, port, world_size, timeout_s=timeout_s)
    futures += generation.init_collective(address, port, world_size, timeout_s=timeout_s)
    _wait_all(futures, "init_refit_collective")


def refit_policy_generation(
    policy: RefitSourcePolicy,
    generation: GenerationInterface,
    colocated: bool,
    timer: Timer | None = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> float:
    """Copy the policy's current weights into every engine; returns the seconds it took (also recorded under
    ``weight_sync`` in ``timer``).

    Raises:
        RefitError: the weights were refused or did not arrive; the engines still serve the previous ones.
    """
    start = time.perf_counter()
    if _samples_with_policy_weights(generation):
        return 0.0
    if timer is not None:
        timer.start(TIMER_LABEL)
    try:
        if colocated:
            _refit_colocated(policy, generation)
        else:
            futures = policy.broadcast_weights_for_collective(bucket_bytes=bucket_bytes)
            futures += generation.update_weights_from_collective(bucket_bytes=bucket_bytes)
            _wait_all(futures, "collective refit")
    finally:
        if timer is not None:
            timer.stop(TIMER_LABEL)
    return time.perf_counter() - start


def _refit_colocated(policy: RefitSourcePolicy, generation: GenerationInterface) -> None:
    policy.offload_before_refit()
    generation.prepare_for_generation(tags=["weights"])
    # Preferred: train rank 0 packs the weights into the object store itself and only a reference passes through
    # here. Otherwise the full state dict comes to the driver and `update_weights_from_state_dict` packs it.
    packed_ref = getattr(policy, "get_packed_state_dict_ref_for_refit", None)
    state_dict = packed_ref() if packed_ref is not None else policy.get_full_state_dict_for_refit()
    try:
        generation.update_weights_from_state_dict(state_dict)
    except (RefitError, WeightTransferError) as error:
        raise RefitError(f"colocated refit failed; the engines keep the previous weights: {error}") from error
    finally:
        del state_dict
        policy.offload_after_refit()
        generation.prepare_for_generation(tags=["kv_cache"])


def _wait_all(futures: list[ray.ObjectRef], what: str) -> None:
    """Wait for every future; on the first failure, let the others finish (receivers abort promptly when the
    source fails) and raise it, as `RefitError` when no weights were loaded, caused by a member that died when one
    did (so the run's stop names the dead worker, not the transfer error its peers saw)."""
    pending = list(futures)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(ready[0])
        except (RefitError, WeightTransferError) as error:
            died = _drain(pending)
            # A member that died is the cause; the others' transfer errors are what its death did to them.
            raise RefitError(f"{what} failed; the engines keep the previous weights: {error}") from (died or error)
        except Exception as error:
            died = _drain(pending)
            if died is not None and not isinstance(error, ray.exceptions.RayActorError):
                raise RefitError(f"{what} failed: a member died") from died
            raise


def _drain(pending: list[ray.ObjectRef]) -> ray.exceptions.RayActorError | None:
    """Let the other members finish (bounded); the first of them that died, if one did."""
    died = None
    done, still = ray.wait(pending, num_returns=len(pending), timeout=_DRAIN_AFTER_FAILURE_S)
    for ref in done:
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError as error:
            died = died or error
        except Exception as error:  # already reporting the first failure
            logger.warning("refit: another member failed too: %s", str(error).splitlines()[0] if str(error) else error)
    if still:
        logger.warning("refit: %d members still busy %.0f s after the failure", len(still), _DRAIN_AFTER_FAILURE_S)
    return died
