"""Move a named set of tensors between Ray actors: broadcast over a stand-alone gloo/NCCL group, or pack them
into one flat buffer that Ray's object store shares without copies.

`pack_tensors` / `unpack_tensors` (colocated refit): one aligned ``uint8`` numpy buffer plus the tensor list. Ray
stores a numpy buffer in shared memory with a single copy and hands every reader on the node a read-only view of
it, so ``unpack_tensors`` returns views into shared memory (no copy, no disk).

Broadcast (non-colocated refit): train rank 0 (the source) sends the full state dict to every generation worker.
The group is built from its own ``TCPStore`` and never touches ``torch.distributed``'s default process group,
which the training workers already use for FSDP (and vLLM for its own ranks).

Protocol (every member calls the matching function; the source is rank ``src``):

1. The source broadcasts its tensor list (names, shapes, dtypes) as a small JSON header.
2. Every receiver compares it with the tensors it expects; all members agree (an all-reduce of a flag) before any
   weight moves, so a mismatch fails on every member with the same error instead of deadlocking.
3. Tensors travel in size-bounded buckets (flat byte buffers packed on the group's device). Before each bucket the
   source broadcasts a status flag, so a source that fails mid-way (e.g. cannot produce a tensor) aborts the
   receivers at once instead of letting them wait for the timeout.

Receivers fill fresh buffers and return the tensors only after the last bucket arrived: a caller never sees a
partial set. A source that dies makes the receivers' broadcast fail ("connection closed by peer") or time out.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

DEFAULT_BUCKET_BYTES = 256 * 1024 * 1024
DEFAULT_TIMEOUT_S = 300.0
# Every tensor starts at a multiple of this offset in its bucket, so receivers can view the bytes as any dtype.
_ALIGN_BYTES = 16
_CONTINUE, _ABORT = 1, 0


class WeightTransferError(RuntimeError):
    """A transfer did not complete; receivers hold nothing from it."""


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a transfer: its name, full shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _itemsize(self.dtype)

    @property
    def padded_nbytes(self) -> int:
        """Bytes it takes in a bucket (rounded up to the alignment)."""
        return -(-self.nbytes // _ALIGN_BYTES) * _ALIGN_BYTES

    def to_json(self) -> list:
        return [self.name, list(self.shape), str(self.dtype).removeprefix("torch.")]

    @classmethod
    def from_json(cls, item: list) -> TensorSpec:
        name, shape, dtype = item
        return cls(name, tuple(shape), getattr(torch, dtype))


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def specs_from_state_dict(state_dict: Mapping[str, torch.Tensor]) -> list[TensorSpec]:
    """Specs of ``state_dict`` in name order (the order every member uses)."""
    return [TensorSpec(name, tuple(t.shape), t.dtype) for name, t in sorted(state_dict.items())]


def specs_from_info(info: Mapping[str, tuple[Iterable[int], torch.dtype]]) -> list[TensorSpec]:
    """Specs from ``{name: (shape, dtype)}`` (what ``prepare_refit_info`` returns), in name order."""
    return [TensorSpec(name, tuple(int(d) for d in shape), dtype) for name, (shape, dtype) in sorted(info.items())]


def plan_buckets(specs: Iterable[TensorSpec], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[list[TensorSpec]]:
    """Group ``specs`` (order kept) into buckets of at most ``bucket_bytes`` (each tensor counted with its
    alignment padding); a larger tensor gets its own bucket."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    buckets: list[list[TensorSpec]] = []
    current: list[TensorSpec] = []
    size = 0
    for spec in specs:
        if current and size + spec.padded_nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(spec)
        size += spec.padded_nbytes
    if current:
        buckets.append(current)
    return buckets


def describe_spec_mismatch(expected: Iterable[TensorSpec], got: Iterable[TensorSpec], dtypes: bool = True) -> str:
    """Human-readable differences between two spec lists ('' when they match)."""
    want = {s.name: s for s in expected}
    have = {s.name: s for s in got}
    problems = []
    missing = sorted(set(want) - set(have))
    unexpected = sorted(set(have) - set(want))
    if missing:
        problems.append(f"missing {_clip(missing)}")
    if unexpected:
        problems.append(f"unexpected {_clip(unexpected)}")
    for name in sorted(set(want) & set(have)):
        a, b = want[name], have[name]
        if a.shape != b.shape or (dtypes and a.dtype != b.dtype):
            problems.append(f"{name}: expected {list(a.shape)} {a.dtype}, got {list(b.shape)} {b.dtype}")
    return "; ".join(problems)


def _clip(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return f"[{shown}{f', ... ({len(names)} in all)' if len(names) > limit else ''}]"


@dataclass
class PackedTensors:
    """Tensors laid out back to back (16-byte aligned) in one flat byte buffer, in ``specs`` order."""

    specs: list[TensorSpec]
    buffer: np.ndarray  # uint8, 1-D

    @property
    def nbytes(self) -> int:
        return sum(spec.nbytes for spec in self.specs)


def pack_tensors(state_dict: Mapping[str, torch.Tensor]) -> PackedTensors:
    """Copy ``state_dict`` (CPU or not) into one flat CPU buffer (name order)."""
    specs = specs_from_state_dict(state_dict)
    return PackedTensors(specs, _pack(specs, state_dict, torch.device("cpu")).numpy())


def unpack_tensors(packed: PackedTensors) -> dict[str, torch.Tensor]:
    """``{name: tensor}`` viewing ``packed.buffer`` (no copy; read-only when the buffer came from Ray's store)."""
    with warnings.catch_warnings():  # a read-only buffer from the object store: we only ever read from it
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.from_numpy(packed.buffer)
    return _unpack(packed.specs, flat)


class WeightTransferGroup:
    """A process group of ``world_size`` members, independent of the default process group.

    Args:
        master_address, master_port: where rank 0 hosts the group's ``TCPStore`` (rank 0 must be reachable there).
        rank, world_size: this member's place in the group.
        device: ``"cpu"`` → gloo; a CUDA device → NCCL (buckets are packed on that device).
        timeout_s: how long a member waits for the others (rendezvous and every collective).
    """

    def __init__(
        self,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        device: torch.device | str = "cpu",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        name: str = "nrl_weight_transfer",
    ) -> None:
        if world_size < 2 or not 0 <= rank < world_size:
            raise ValueError(
                f"need world_size >= 2 and 0 <= rank < world_size, got rank={rank}, world_size={world_size}"
            )
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device)
        timeout = datetime.timedelta(seconds=timeout_s)
        try:
            store = dist.TCPStore(master_address, master_port, world_size, is_master=rank == 0, timeout=timeout)
        except (RuntimeError, dist.DistStoreError) as error:
            raise WeightTransferError(
                f"weight transfer group {name!r}: rank {rank} could not reach the store at "
                f"{master_address}:{master_port} within {timeout_s} s: {error}"
            ) from error
        prefixed = dist.PrefixStore(name, store)
        # A bare backend (no default group needed). Torch's stubs give backends no collectives and miss the default
        # of NCCL's `options`, so the handle is untyped.
        self._pg: Any
        if self.device.type == "cuda":
            self._pg = dist.ProcessGroupNCCL(prefixed, rank, world_size)  # type: ignore[call-arg]
        else:
            self._pg = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
        self._store = store  # the master's store must outlive the group

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = src
        self._pg.broadcast([tensor], options).wait()

    def all_agree(self, ok: bool) -> bool:
        """True on every member iff every member passed ``ok=True``."""
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=self.device)
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp(dist.ReduceOp.MIN)
        self._pg.allreduce([flag], options).wait()
        return bool(flag.item())

    def destroy(self) -> None:
        self._pg = None
        self._store = None  # type: ignore[assignment]


def broadcast_state_dict(
    group: WeightTransferGroup,
    state_dict: Mapping[str, torch.Tensor],
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    specs: Iterable[TensorSpec] | None = None,
) -> int:
    """Send ``state_dict`` from this member (the source) to every other member; returns the tensor bytes sent.

    With ``specs`` (e.g. from ``prepare_refit_info``) the tensors are read lazily, bucket by bucket, so
    ``state_dict`` may be a mapping that produces (gathers) each tensor on access. If reading or packing one
    raises, the receivers are told to abort and the error is re-raised here as `WeightTransferError`.
    """
    specs = sorted(specs, key=lambda s: s.name) if specs is not None else specs_from_state_dict(state_dict)
    header = json.dumps([spec.to_json() for spec in specs]).encode()
    _broadcast_bytes(group, header, src=group.rank)
    if not group.all_agree(True):
        raise WeightTransferError(
            f"a receiver rejected the weights offered by rank {group.rank} (names or shapes differ from what it "
            "expects; its error says which)"
        )
    sent = 0
    buckets = plan_buckets(specs, bucket_bytes)
    for index, bucket in enumerate(buckets):
        try:
            flat = _pack(bucket, state_dict, group.device)
        except Exception as error:
            _send_status(group, _ABORT, src=group.rank)
            raise WeightTransferError(
                f"weight broadcast aborted at bucket {index + 1} of {len(buckets)}: {type(error).__name__}: {error}"
            ) from error
        _send_status(group, _CONTINUE, src=group.rank)
        group.broadcast(flat, src=group.rank)
        sent += sum(spec.nbytes for spec in bucket)
    return sent


def receive_state_dict(
    group: WeightTransferGroup,
    expected: Iterable[TensorSpec],
    src: int = 0,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    check_dtypes: bool = True,
) -> dict[str, torch.Tensor]:
    """Receive what `broadcast_state_dict` on member ``src`` sends; returns ``{name: tensor}`` on the group device.

    Raises `WeightTransferError` (and nothing is returned) when the offered tensors differ from ``expected``
    (names, shapes, and dtypes if ``check_dtypes``), when the source aborts, or when the connection fails.
    """
    expected = sorted(expected, key=lambda spec: spec.name)
    try:
        offered = [TensorSpec.from_json(item) for item in json.loads(_broadcast_bytes(group, None, src=src))]
        mismatch = describe_spec_mismatch(expected, offered, dtypes=check_dtypes)
        if not group.all_agree(not mismatch):
            raise WeightTransferError(
                f"weights offered by rank {src} do not match this receiver: {mismatch}"
                if mismatch
                else f"another receiver rejected the weights offered by rank {src}"
            )
        received: dict[str, torch.Tensor] = {}
        buckets = plan_buckets(offered, bucket_bytes)
        for index, bucket in enumerate(buckets):
            if _receive_status(group, src) != _CONTINUE:
                raise WeightTransferError(
                    f"the source (rank {src}) aborted the weight broadcast at bucket {index + 1} of {len(buckets)}"
                )
            flat = torch.empty(sum(spec.padded_nbytes for spec in bucket), dtype=torch.uint8, device=group.device)
            group.broadcast(flat, src=src)
            received.update(_unpack(bucket, flat))
    except WeightTransferError:
        raise
    except RuntimeError as error:  # gloo/NCCL: peer gone, timeout
        raise WeightTransferError(f"weight broadcast from rank {src} failed: {error}") from error
    return received


def _broadcast_bytes(group: WeightTransferGroup, payload: bytes | None, src: int) -> bytes:
    length = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64, device=group.device)
    group.broadcast(length, src=src)
    buffer = (
        torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(group.device)
        if payload is not None
        else torch.empty(int(length.item()), dtype=torch.uint8, device=group.device)
    )
    group.broadcast(buffer, src=src)
    return bytes(buffer.cpu().numpy())


def _send_status(group: WeightTransferGroup, status: int, src: int) -> None:
    group.broadcast(torch.tensor([status], dtype=torch.int32, device=group.device), src=src)


def _receive_status(group: WeightTransferGroup, src: int) -> int:
    status = torch.empty(1, dtype=torch.int32, device=group.device)
    group.broadcast(status, src=src)
    return int(status.item())


def _pack(bucket: list[TensorSpec], state_dict: Mapping[str, torch.Tensor], device: torch.device) -> torch.Tensor:
    # Alignment padding stays uninitialised: it is never read back as tensor data.
    flat = torch.empty(sum(spec.padded_nbytes for spec in bucket), dtype=torch.uint8, device=device)
    offset = 0
    for spec in bucket:
        tensor = state_dict[spec.name]
        if tuple(tensor.shape) != spec.shape or tensor.dtype != spec.dtype:
            raise ValueError(
                f"{spec.name} is {list(tensor.shape)} {tensor.dtype}, announced as {list(spec.shape)} {spec.dtype}"
            )
        flat[offset : offset + spec.nbytes] = tensor.detach().contiguous().reshape(-1).view(torch.uint8).to(device)
        offset += spec.padded_nbytes
    return flat


def _unpack(bucket: list[TensorSpec], flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """Views into ``flat`` (no copy): the bucket buffer stays alive as long as its tensors."""
    tensors = {}
    offset = 0
    for spec in bucket:
        tensors[spec.name] = flat[offset : offset + spec.nbytes].view(spec.dtype).reshape(spec.shape)
        offset += spec.padded_nbytes
    return tensors


__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "PackedTensors",
    "TensorSpec",
    "WeightTransferError",
    "WeightTransferGroup",
    "broadcast_state_dict",
    "describe_spec_mismatch",
    "pack_tensors",
    "plan_buckets",
    "receive_state_dict",
    "specs_from_info",
    "specs_from_state_dict",
    "unpack_tensors",
]
