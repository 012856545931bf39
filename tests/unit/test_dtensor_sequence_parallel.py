"""Sequence parallelism over DTensor tensor parallelism (``policy.dtensor_cfg.sequence_parallel``), against the
unsplit Hugging Face model in the same process: two gloo ranks, the tiny random Llama in fp32, a sequence of odd
length (the two ranks hold 4 and 3 of its 7 tokens), activation checkpointing on, and the same rows packed into one
(sequence packing's per-sample attention). Plain TP is checked the same way.
The policy-level run (dp=2 x tp=2 with sequence parallelism, trained against the single-process reference) is the
``tensor_parallel`` fixture of tests/unit/test_policy_dtensor.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM, Gemma2Config

from nemo_rl_clone.models.huggingface import TINY_LLAMA, resolve_model_path
from nemo_rl_clone.models.policy.dtensor import parallel
from nemo_rl_clone.models.policy.workers.packed_sequences import PACKED_ATTENTION, PackedRows

# fp32 with the same weights: the split only reorders sums (the reduce-scatter adds two partial products).
ATOL = 1e-5


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach()
        for name, p in model.named_parameters()
    }


def _worker(rank: int, world_size: int, rendezvous: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world_size)
    torch.set_num_threads(1)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module

        path = resolve_model_path(TINY_LLAMA)
        torch.manual_seed(0)
        input_ids = torch.randint(0, 1000, (2, 7))
        reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
        expected = reference(input_ids=input_ids, use_cache=False).logits
        rows = PackedRows(torch.tensor([7, 4]), 7)  # right padding leaves a causal model's valid logits as they are
        expected.square().mean().backward()
        mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
        record: dict[str, object] = {}
        for sequence_parallel in (False, True):
            model = AutoModelForCausalLM.from_pretrained(
                path, dtype=torch.float32, attn_implementation=PACKED_ATTENTION
            )
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.train()
            plan = parallel.tensor_parallel_plan(model)
            if sequence_parallel:
                plan = parallel.sequence_parallel_plan(model, plan)
            parallelize_module(model, mesh, parallel._matching_modules(model, plan))
            stream: list[tuple[int, ...]] = []  # what a norm between the blocks holds on this rank

            def held(_module: object, _inputs: object, out: torch.Tensor, stream: list = stream) -> None:
                stream.append(tuple(getattr(out, "to_local", lambda: out)().shape))

            model.model.layers[1].post_attention_layernorm.register_forward_hook(held)
            logits = model(input_ids=input_ids, use_cache=False).logits
            logits.square().mean().backward()
            grads = _grads(model)
            with torch.no_grad():  # the two rows as one packed row of 7 + 4 tokens (split 6 + 5 over the ranks)
                packed = model(input_ids=rows.pack(input_ids), use_cache=False, **rows.model_kwargs()).logits
            record[f"sp={sequence_parallel}"] = {
                "logits": float((logits - expected).abs().max()),
                "packed": float((rows.unpack(packed) - expected).abs()[rows.valid].max()),
                "grads": max(float((grads[n] - p.grad).abs().max()) for n, p in reference.named_parameters()),
                "stream": stream[0],
            }
        torch.save(record, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_sequence_parallel_logits_and_gradients_equal_the_unsplit_model(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(2, str(tmp_path / "rdzv"), str(tmp_path)), nprocs=2, join=True)
    for rank, tokens in ((0, 4), (1, 3)):
        record = torch.load(tmp_path / f"rank{rank}.pt")
        for key in ("sp=False", "sp=True"):
            assert record[key]["logits"] <= ATOL, (rank, key, record[key])
            assert record[key]["packed"] <= ATOL, (rank, key, record[key])
            assert record[key]["grads"] <= ATOL, (rank, key, record[key])
        assert record["sp=False"]["stream"] == (2, 7, 128)  # plain TP: every rank holds the whole sequence
        assert record["sp=True"]["stream"] == (2, tokens, 128)  # split: 4 + 3 of the 7 tokens


def test_other_decoder_layer_forms_are_refused_in_one_line() -> None:
    config = Gemma2Config(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, head_dim=8,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    with pytest.raises(ValueError) as err:
        parallel.sequence_parallel_plan(model, parallel.tensor_parallel_plan(model))
    message = str(err.value)
    assert message.startswith("policy.dtensor_cfg.sequence_parallel: Gemma2ForCausalLM's decoder layers have [")
    assert "post_feedforward_layernorm" in message and message.endswith("set it to false")
