"""`contract/logprobs.py` and `distributed/model_utils.py`: token logprobs from (vocab-parallel) logits and global
valid counts, against the unsharded computation on a real 2-process gloo group."""

import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from nemo_rl_clone.algorithms.loss import NLLLossFn
from nemo_rl_clone.contract.logprobs import token_logprobs_from_logits
from nemo_rl_clone.contract.sampling import TrainingSamplingParams
from nemo_rl_clone.distributed.model_utils import valid_counts
from tests.unit.test_loss_functions import ALL_BRANCHES, pg_loss, random_batch, reference_logprobs, uniform_batch

SAMPLING = {
    "top_k_top_p": TrainingSamplingParams(temperature=0.7, top_k=3, top_p=0.8),
    "top_p": TrainingSamplingParams(temperature=1.3, top_k=None, top_p=0.7),
    # on logits rounded to integers: ties at the boundary span both shards, and only the lowest ids stay
    "ties_top_k": TrainingSamplingParams(temperature=1.0, top_k=3, top_p=1.0, tie_rule="lowest_index"),
    "ties_top_k_top_p": TrainingSamplingParams(temperature=0.7, top_k=4, top_p=0.8, tie_rule="lowest_index"),
    "ties_top_p": TrainingSamplingParams(temperature=1.0, top_k=None, top_p=0.6, tie_rule="lowest_index"),
    # a shard holding more ties at the k-th value than its own top-k offer: top-p's mass counts all of them
    "ties_keep_all_top_k_top_p": TrainingSamplingParams(temperature=1.0, top_k=3, top_p=0.55),
}


def _vocab_parallel_worker(rank: int, world_size: int, rendezvous: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world_size)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        logits, data = random_batch(seed=21, vocab=12)
        full = logits.detach()
        shard_size = full.shape[-1] // world_size
        local = full[..., rank * shard_size : (rank + 1) * shard_size].clone().requires_grad_()
        diffs = {}

        expected_lp = reference_logprobs(full, data["input_ids"])
        sharded_lp = token_logprobs_from_logits(local, data["input_ids"], vocab_parallel_group=dist.group.WORLD)
        diffs["logprobs"] = (sharded_lp.double() - expected_lp).abs().max().item()
        chunked_lp = token_logprobs_from_logits(
            local, data["input_ids"], vocab_parallel_group=dist.group.WORLD, chunk_size=4
        )
        diffs["chunked_logprobs"] = (chunked_lp.double() - expected_lp).abs().max().item()

        for name, loss_fn in (("clipped_pg", pg_loss(**ALL_BRANCHES)), ("nll", NLLLossFn())):
            unsharded = full.clone().requires_grad_()
            seqs, toks = valid_counts(data)
            expected, _ = loss_fn(unsharded, data, seqs, toks)
            expected.backward()
            local.grad = None
            loss, _ = loss_fn(local, data, seqs, toks, vocab_parallel_rank=rank, vocab_parallel_group=dist.group.WORLD)
            loss.backward()
            expected_grad = unsharded.grad[..., rank * shard_size : (rank + 1) * shard_size]
            diffs[f"{name}_loss"] = abs(loss.item() - expected.item())
            diffs[f"{name}_grad"] = (local.grad - expected_grad).abs().max().item()
            local.grad = None
            chunked, _ = loss_fn(
                local,
                data,
                seqs,
                toks,
                vocab_parallel_rank=rank,
                vocab_parallel_group=dist.group.WORLD,
                logprob_chunk_size=4,
            )
            chunked.backward()
            diffs[f"{name}_chunked_loss"] = abs(chunked.item() - expected.item())
            diffs[f"{name}_chunked_grad"] = (local.grad - expected_grad).abs().max().item()

        # Sampling-aware logprobs (temperature, top-k, top-p) from shards equal the unsharded ones, gradients too.
        tied = full.round()
        crowded_shard = torch.tensor([5.0, 4, 3, 3, 3, 0, 3, 0, 0, 0, 0, 0]).expand_as(full).contiguous()
        for name, params in SAMPLING.items():
            source = crowded_shard if "keep_all" in name else tied if name.startswith("ties") else full
            unsharded = source.clone().requires_grad_()
            want = token_logprobs_from_logits(unsharded, data["input_ids"], sampling=params)
            want.sum().backward()
            expected_grad = unsharded.grad[..., rank * shard_size : (rank + 1) * shard_size]
            shard = source[..., rank * shard_size : (rank + 1) * shard_size].clone().requires_grad_()
            for chunk in (None, 4):
                shard.grad = None
                got = token_logprobs_from_logits(
                    shard, data["input_ids"], vocab_parallel_group=dist.group.WORLD, chunk_size=chunk, sampling=params
                )
                got.sum().backward()
                tag = f"{name}_{'chunked' if chunk else 'whole'}"
                diffs[f"{tag}_logprobs"] = (got - want).abs().max().item()
                diffs[f"{tag}_grad"] = (shard.grad - expected_grad).abs().max().item()

        mesh = init_device_mesh("cpu", (world_size,))
        dtensor = distribute_tensor(full.clone(), mesh, [Shard(2)]).requires_grad_()
        dtensor_lp = token_logprobs_from_logits(dtensor, data["input_ids"])
        diffs["dtensor_logprobs"] = (dtensor_lp.double() - expected_lp).abs().max().item()
        dtensor_lp = token_logprobs_from_logits(dtensor, data["input_ids"], chunk_size=2)
        diffs["dtensor_chunked_logprobs"] = (dtensor_lp.double() - expected_lp).abs().max().item()

        halves = {k: v[rank * 3 : (rank + 1) * 3] for k, v in data.items()}
        seqs, toks = valid_counts(halves, group=dist.group.WORLD)
        all_seqs, all_toks = valid_counts(data)
        diffs["global_counts"] = abs(seqs.item() - all_seqs.item()) + abs(toks.item() - all_toks.item())
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(diffs, f)
        dist.barrier()  # no rank tears gloo down while the other is still inside a collective
    finally:
        dist.destroy_process_group()


def test_vocab_parallel_logprobs_and_losses_match_unsharded(tmp_path):
    mp.spawn(_vocab_parallel_worker, args=(2, str(tmp_path / "rdzv"), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        diffs = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert set(diffs) == {
            "logprobs",
            "chunked_logprobs",
            *(
                f"{loss}_{chunked}{what}"
                for loss in ("clipped_pg", "nll")
                for chunked in ("", "chunked_")
                for what in ("loss", "grad")
            ),
            "dtensor_logprobs",
            "dtensor_chunked_logprobs",
            "global_counts",
            *(
                f"{name}_{how}_{what}"
                for name in SAMPLING
                for how in ("whole", "chunked")
                for what in ("logprobs", "grad")
            ),
        }
        assert all(value <= 1e-6 for value in diffs.values()), {k: v for k, v in diffs.items() if v > 1e-6}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_size", [1, 4, 6, 50])
def test_chunked_logprobs_and_losses_match_unchunked(chunk_size: int, dtype: torch.dtype) -> None:
    """policy.logprob_chunk_size: the same logprobs, losses and logit gradients as one pass over all positions,
    to 1e-6 (fp32 arithmetic in both; 6 predicted positions, so 4 leaves an uneven last chunk and 50 is one chunk)."""
    logits, data = random_batch(seed=5, vocab=12)
    logits = logits.detach().to(dtype)
    whole = token_logprobs_from_logits(logits, data["input_ids"])
    chunked = token_logprobs_from_logits(logits, data["input_ids"], chunk_size=chunk_size)
    assert chunked.dtype == torch.float32 and chunked.shape == whole.shape
    assert (chunked - whole).abs().max().item() <= 1e-6
    for loss_fn in (pg_loss(**ALL_BRANCHES), NLLLossFn()):
        seqs, toks = valid_counts(data)
        grads, losses = [], []
        for size in (None, chunk_size):
            leaf = logits.clone().requires_grad_()
            loss, _ = loss_fn(leaf, data, seqs, toks, logprob_chunk_size=size)
            loss.backward()
            losses.append(loss.item())
            grads.append(leaf.grad.float())
        assert grads[1].dtype == torch.float32 and abs(losses[0] - losses[1]) <= 1e-6
        tolerance = 1e-6 if dtype == torch.float32 else 1e-2  # bf16 gradients round to ~3 significant digits
        assert (grads[0] - grads[1]).abs().max().item() <= tolerance


def test_chunk_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="chunk_size must be >= 1 or None, got 0"):
        token_logprobs_from_logits(torch.zeros(1, 3, 4), torch.zeros(1, 3, dtype=torch.long), chunk_size=0)


def test_valid_counts_and_logprob_shape_errors():
    _, data = uniform_batch(
        [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], token_mask=[[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]], sample_mask=[1.0, 0.0]
    )
    seqs, toks = valid_counts(data)
    assert (seqs.item(), toks.item()) == (1.0, 2.0)
    with pytest.raises(ValueError, match=r"logits must be \[B, S, V\] and input_ids \[B, S\]"):
        token_logprobs_from_logits(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 4\)"):
        token_logprobs_from_logits(torch.zeros(1, 2, 4), torch.tensor([[0, 4]]))
