"""`weight_transfer`: bucket plans, and real broadcasts between Ray actors over a stand-alone gloo group.

One sender (member 0) and two receivers (actors in `tests.unit.weight_transfer_actors`); every scenario runs on
the same three actors and the same group, which also checks that a rejected or aborted transfer leaves the group
usable for the next one.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import ray
import torch

from nemo_rl_clone.distributed.weight_transfer import (
    TensorSpec,
    WeightTransferError,
    WeightTransferGroup,
    describe_spec_mismatch,
    pack_tensors,
    plan_buckets,
    specs_from_info,
    specs_from_state_dict,
    unpack_tensors,
)
from tests.unit.weight_transfer_actors import TransferMember, make_state_dict


# ---------------------------------------------------------------------------- pure planning
def test_plan_buckets_bounds_size_and_keeps_order() -> None:
    specs = [TensorSpec(f"t{i}", (n,), torch.float32) for i, n in enumerate([10, 10, 30, 5, 100, 1])]
    # fp32 sizes 40, 40, 120, 20, 400, 4 bytes take 48, 48, 128, 32, 400, 16 with 16-byte alignment.
    buckets = plan_buckets(specs, bucket_bytes=100)
    assert [[s.name for s in b] for b in buckets] == [["t0", "t1"], ["t2"], ["t3"], ["t4"], ["t5"]]
    # Only a single tensor larger than the bound may exceed it.
    assert all(sum(s.padded_nbytes for s in b) <= 100 or len(b) == 1 for b in buckets)
    assert [s for b in buckets for s in b] == specs
    assert plan_buckets([], 80) == []
    with pytest.raises(ValueError, match="bucket_bytes must be >= 1"):
        plan_buckets(specs, 0)


def test_specs_and_mismatch_description() -> None:
    state = make_state_dict()
    specs = specs_from_state_dict(state)
    assert [s.name for s in specs] == sorted(state)
    assert specs_from_info({k: (v.shape, v.dtype) for k, v in state.items()}) == specs
    assert TensorSpec("x", (2, 3), torch.bfloat16).nbytes == 12
    assert TensorSpec.from_json(TensorSpec("x", (2, 3), torch.bfloat16).to_json()) == TensorSpec(
        "x", (2, 3), torch.bfloat16
    )

    other = [s for s in specs if s.name != "mask"] + [TensorSpec("extra", (1,), torch.float32)]
    other = [TensorSpec(s.name, (99,), s.dtype) if s.name == "scale" else s for s in other]
    message = describe_spec_mismatch(specs, other)
    assert "missing [mask]" in message and "unexpected [extra]" in message
    assert "scale: expected [] torch.float32, got [99] torch.float32" in message
    assert describe_spec_mismatch(specs, list(reversed(specs))) == ""
    cast = [TensorSpec(s.name, s.shape, torch.float16) for s in specs]
    assert describe_spec_mismatch(specs, cast, dtypes=False) == ""


def test_pack_round_trips_through_the_object_store(ray_local: None) -> None:
    state = make_state_dict()
    packed = pack_tensors(state)
    assert packed.nbytes == sum(t.numel() * t.element_size() for t in state.values())
    assert packed.buffer.dtype == np.uint8 and packed.buffer.nbytes == sum(s.padded_nbytes for s in packed.specs)
    shared = ray.get(ray.put(packed))  # a read-only view of the store's shared memory
    assert not shared.buffer.flags.writeable
    unpacked = unpack_tensors(shared)
    assert sorted(unpacked) == sorted(state)
    for name, tensor in state.items():
        assert unpacked[name].dtype == tensor.dtype and torch.equal(unpacked[name], tensor), name


def test_group_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="world_size >= 2"):
        WeightTransferGroup("127.0.0.1", 1, rank=0, world_size=1)
    with pytest.raises(ValueError, match="0 <= rank < world_size"):
        WeightTransferGroup("127.0.0.1", 1, rank=2, world_size=2)


# ---------------------------------------------------------------------------- real transfers between actors
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def members(ray_local: None) -> Iterator[list[Any]]:
    actors = [TransferMember.remote() for _ in range(3)]
    port = _free_port()
    ray.get([actor.join.remote(port, rank, 3) for rank, actor in enumerate(actors)])
    yield actors
    for actor in actors:
        ray.kill(actor)


def _outcomes(refs: list[ray.ObjectRef]) -> list[Any]:
    results = []
    for ref in refs:
        try:
            results.append(ray.get(ref))
        except WeightTransferError as error:
            results.append(error)
    return results


def test_broadcast_is_bit_exact_in_bounded_buckets(members: list[Any]) -> None:
    bucket_bytes = 10_000  # several buckets; layer.1.weight (65,536 B) travels alone
    sender, *receivers = members
    refs = [sender.send.remote(bucket_bytes)] + [r.receive.remote(bucket_bytes) for r in receivers]
    sent, *received = ray.get(refs)
    expected = make_state_dict()
    assert sent == sum(t.numel() * t.element_size() for t in expected.values())
    for state in received:
        assert sorted(state) == sorted(expected)
        for name, tensor in expected.items():
            assert state[name].dtype == tensor.dtype and state[name].shape == tensor.shape, name
            assert torch.equal(state[name], tensor), name


def test_mismatched_weights_are_refused_by_every_member(members: list[Any]) -> None:
    sender, *receivers = members
    refs = [sender.send.remote(10_000, drop="mask")] + [r.receive.remote(10_000) for r in receivers]
    sender_error, *receiver_errors = _outcomes(refs)
    assert isinstance(sender_error, WeightTransferError) and "a receiver rejected the weights" in str(sender_error)
    for error in receiver_errors:
        assert isinstance(error, WeightTransferError) and "missing [mask]" in str(error)
    test_broadcast_is_bit_exact_in_bounded_buckets(members)  # the group is still usable


def test_source_failure_mid_way_aborts_receivers(members: list[Any]) -> None:
    sender, *receivers = members
    # Buckets in name order at 10,000 B: [counts, empty, layer.0.bias, layer.0.weight], [layer.1.weight], [mask, scale]
    refs = [sender.send.remote(10_000, failing="mask")] + [r.receive.remote(10_000) for r in receivers]
    sender_error, *receiver_errors = _outcomes(refs)
    assert isinstance(sender_error, WeightTransferError)
    assert "aborted at bucket 3 of 3" in str(sender_error) and "could not gather mask" in str(sender_error)
    for error in receiver_errors:
        assert isinstance(error, WeightTransferError), error
        assert "the source (rank 0) aborted the weight broadcast at bucket 3 of 3" in str(error)
    test_broadcast_is_bit_exact_in_bounded_buckets(members)


def test_dead_source_fails_receivers(ray_local: None) -> None:
    actors = [TransferMember.remote() for _ in range(2)]
    port = _free_port()
    ray.get([actor.join.remote(port, rank, 2) for rank, actor in enumerate(actors)])
    pending = actors[1].receive.remote(10_000)
    ray.kill(actors[0])  # the source dies before sending anything
    (error,) = _outcomes([pending])
    assert isinstance(error, WeightTransferError) and "weight broadcast from rank 0 failed" in str(error)
    ray.kill(actors[1])
