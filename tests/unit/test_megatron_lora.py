"""LoRA on the Megatron backend (``megatron_cfg.peft``, `megatron.lora`), in spawned gloo processes, against Hugging
Face's model with the same adapters added by hand.

`test_megatron_policy`'s tiny Llama (4 layers) gets adapters of rank 4 (alpha 8: scaling 2) on the four default
layers. Scenarios, one spawn each:

- ``single`` (one process): logprobs at the start; two NLL steps, with the merged weights the engines would get and
  the adapters after each; logprobs and reference logprobs after training.
- ``tp2`` (two tensor-parallel ranks, sequence parallel): the same two steps from the same start (adapters sharded
  as their layers); a run checkpoint after step 1.
- ``pp2_resumed`` (two pipeline stages): loads that checkpoint (saved at TP 2) and takes step 2.

Megatron fuses Q, K and V (interleaved per query group) and gate and up into one layer each, so its adapter on such
a layer is one ``A`` shared by the parts and one ``B`` whose rows split as the weight's do: the reference adds
``scaling · B_part A x`` to each Hugging Face projection, ``B_part`` cut from ``B`` by the converter itself.
Tolerance 1e-5 (fp32).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.models.policy.config import PolicyConfig
from nemo_rl_clone.utils.config_validation import validate_config
from tests.unit.test_megatron_policy import (
    ATOL,
    _step,
    hf_logprobs,
    make_batches,
    max_diff,
    policy_dict,
    spawn,
    tiny_llama_dir,
)

DIM, ALPHA = 4, 8
SCALING = ALPHA / DIM


def lora_config(model_dir: str, pp: int = 1, tp: int = 1) -> PolicyConfig:
    section = policy_dict(
        model_dir, tp, pp, peft={"enabled": True, "dim": DIM, "alpha": ALPHA}, sequence_parallel=tp > 1
    )
    return validate_config(section, PolicyConfig)


def adapters(worker: Any) -> dict[str, torch.Tensor]:
    from nemo_rl_clone.models.policy.megatron import model as mmodel

    gpt = mmodel.unwrap(worker.model)
    return {
        name: param.detach().clone() for name, param in gpt.named_parameters() if name.endswith(("lora_A", "lora_B"))
    }


# ---------------------------------------------------------------------------- scenarios (run in the children)
def _worker(model_dir: str, pp: int = 1, tp: int = 1, **kwargs: Any) -> Any:
    from nemo_rl_clone.models.huggingface import load_tokenizer
    from nemo_rl_clone.models.policy.megatron.policy_worker import MegatronPolicyWorker

    return MegatronPolicyWorker(lora_config(model_dir, pp, tp), load_tokenizer(model_dir), model_dir, **kwargs)


def run_single(model_dir: str, run_dir: str, batches: list[BatchedDataDict]) -> dict[str, Any]:
    worker = _worker(model_dir)
    result: dict[str, Any] = {"logprobs": worker.get_logprobs(batches[0])["logprobs"], "adapters": [adapters(worker)]}
    result["steps"] = []
    for data in batches[:2]:
        result["steps"].append(_step(worker, data))
        result["adapters"].append(adapters(worker))
    result["final_logprobs"] = worker.get_logprobs(batches[0])["logprobs"]
    result["reference_logprobs"] = worker.get_reference_policy_logprobs(batches[0])["reference_logprobs"]
    result["refusals"] = [_target_refusal(worker, **keys) for keys in BAD_TARGETS]
    worker.shutdown()
    return result


# Hugging Face's projection names, and an exclusion of every default target.
BAD_TARGETS = ({"target_modules": ["q_proj"]}, {"exclude_modules": ["*.linear_*"]})


def _target_refusal(worker: Any, **keys: Any) -> str:
    import dataclasses

    from nemo_rl_clone.models.policy.megatron import lora
    from nemo_rl_clone.models.policy.megatron import model as mmodel
    from nemo_rl_clone.utils.errors import UserInputError

    peft = dataclasses.replace(worker.cfg.megatron_cfg.peft, **keys)
    try:
        lora.target_module_names(mmodel.unwrap(worker.model), peft)
    except UserInputError as error:
        return str(error)
    return ""


def run_tp2(model_dir: str, run_dir: str, batches: list[BatchedDataDict]) -> dict[str, Any]:
    worker = _worker(model_dir, tp=2)
    result: dict[str, Any] = {"steps": []}
    for index, data in enumerate(batches[:2]):
        result["steps"].append(_step(worker, data))
        if index == 0:
            policy = Path(run_dir) / "step_1" / "policy"
            worker.save_checkpoint(str(policy / "weights"), str(policy / "optimizer"))
    result["final_logprobs"] = worker.get_logprobs(batches[0])["logprobs"]
    worker.shutdown()
    return result


def run_pp2_resumed(model_dir: str, run_dir: str, batches: list[BatchedDataDict]) -> dict[str, Any]:
    policy = Path(run_dir) / "step_1" / "policy"
    worker = _worker(model_dir, 2, weights_path=str(policy / "weights"), optimizer_path=str(policy / "optimizer"))
    result = {"step": _step(worker, batches[1])}
    worker.shutdown()
    return result


# ---------------------------------------------------------------------------- the Hugging Face reference
def hf_with_adapters(model_dir: str, megatron_adapters: dict[str, torch.Tensor]) -> tuple[Any, dict[str, torch.Tensor]]:
    """Hugging Face's model with each Megatron adapter added to the projections it covers (forward hooks), and the
    adapters as leaf tensors (Megatron names) that gradients reach."""
    from transformers import AutoModelForCausalLM

    from nemo_rl_clone.models.policy.megatron import converter

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    shape = converter.model_shape(model.config)
    leaves = {name: tensor.clone().requires_grad_(True) for name, tensor in megatron_adapters.items()}
    modules = dict(model.named_modules())
    for name in [n for n in leaves if n.endswith(".lora_A")]:
        layer = name.removesuffix(".lora_A")
        # the converter cuts B's rows as it cuts the fused weight's (B is [out, dim], a weight of "in" = dim)
        parts = converter.megatron_to_hf({f"{layer}.weight": leaves[f"{layer}.lora_B"]}, shape)
        for hf_name, b_part in parts.items():
            module = modules[hf_name.removesuffix(".weight")]
            a = leaves[name]
            module.register_forward_hook(
                lambda mod, args, out, a=a, b=b_part: out + SCALING * torch.nn.functional.linear(args[0] @ a.T, b)
            )
    return model, leaves


def nll(model: Any, data: BatchedDataDict) -> torch.Tensor:
    """NLLLossFn's loss: the mean over the batch's masked tokens of −log p(token)."""
    input_ids = data["input_ids"]
    logits = model(input_ids=input_ids).logits
    logprobs = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    mask = data["token_mask"][:, 1:] * data["sample_mask"][:, None]
    return -(logprobs * mask).sum() / mask.sum()


# ---------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def model_dir(module_tmp_path: Path) -> str:
    return tiny_llama_dir(module_tmp_path)


@pytest.fixture(scope="module")
def batches() -> list[BatchedDataDict]:
    return make_batches()


@pytest.fixture(scope="module")
def run_dir(module_tmp_path: Path) -> Path:
    return module_tmp_path / "lora_run"


@pytest.fixture(scope="module")
def single(model_dir: str, run_dir: Path, batches: list[BatchedDataDict]) -> dict[str, Any]:
    return spawn(1, run_single, model_dir, str(run_dir), batches)


@pytest.fixture(scope="module")
def tp2(model_dir: str, run_dir: Path, batches: list[BatchedDataDict]) -> dict[str, Any]:
    return spawn(2, run_tp2, model_dir, str(run_dir), batches, writes=run_dir / "step_1")


@pytest.fixture(scope="module")
def pp2_resumed(tp2: dict, model_dir: str, run_dir: Path, batches: list[BatchedDataDict]) -> dict[str, Any]:
    return spawn(2, run_pp2_resumed, model_dir, str(run_dir), batches)


# ---------------------------------------------------------------------------- tests
def test_starts_as_the_base_model_and_keeps_it_as_the_reference(single: dict, model_dir: str, batches: list):
    base = hf_logprobs(model_dir, batches[0])
    assert max_diff(single["logprobs"], base) <= ATOL  # lora_B starts at zero
    assert max_diff(single["final_logprobs"], base) > 1e-3  # the adapters trained
    assert max_diff(single["reference_logprobs"], base) <= ATOL
    names = sorted({name.rsplit(".", 2)[-2] for name in single["adapters"][0]})
    assert names == ["linear_fc1", "linear_fc2", "linear_proj", "linear_qkv"]
    assert len(single["adapters"][0]) == 2 * 4 * 4  # A and B, 4 layers, 4 kinds


def test_first_step_equals_hugging_face_with_the_same_adapters(single: dict, model_dir: str, batches: list):
    """Loss and gradient norm (the adapters' only: the base is frozen) by autograd through Hugging Face's model."""
    model, leaves = hf_with_adapters(model_dir, single["adapters"][0])
    loss = nll(model, batches[0])
    loss.backward()
    grad_norm = torch.sqrt(sum(leaf.grad.double().square().sum() for leaf in leaves.values())).item()
    step = single["steps"][0]
    assert abs(step["loss"] - loss.item()) <= ATOL
    assert abs(step["grad_norm"] - grad_norm) <= ATOL * max(1.0, grad_norm)


def test_merged_weights_are_what_the_adapters_compute(single: dict, model_dir: str, batches: list):
    """What the engines get after each step (W + scaling · B @ A, in Hugging Face names) gives the logits of the base
    model with those adapters added, and leaves every weight without an adapter as it was."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    for step, trained in zip(single["steps"], single["adapters"][1:], strict=True):
        merged_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        merged_model.load_state_dict(step["state"])
        adapted, _ = hf_with_adapters(model_dir, trained)
        with torch.no_grad():
            ids = batches[0]["input_ids"]
            assert max_diff(merged_model(input_ids=ids).logits, adapted(input_ids=ids).logits) <= ATOL
        frozen = [name for name in base if "norm" in name or "embed" in name]
        assert frozen and all(torch.equal(step["state"][name], base[name]) for name in frozen)


def test_two_tensor_parallel_ranks_train_like_one_process(tp2: dict, single: dict) -> None:
    """Sharded adapters under sequence parallelism: the same losses, gradient norms (every adapter counted once),
    merged weights and logprobs after two steps as one process."""
    for got, want in zip(tp2["steps"], single["steps"], strict=True):
        assert abs(got["loss"] - want["loss"]) <= ATOL and abs(got["grad_norm"] - want["grad_norm"]) <= ATOL
        assert max_diff(got["state"], want["state"]) <= ATOL
    assert max_diff(tp2["final_logprobs"], single["final_logprobs"]) <= ATOL


def test_checkpoint_resumes_on_two_pipeline_stages(pp2_resumed: dict, single: dict) -> None:
    """Saved at two tensor-parallel ranks, loaded on two pipeline stages: the adapters and their optimizer state
    reshard."""
    got, want = pp2_resumed["step"], single["steps"][1]
    assert abs(got["loss"] - want["loss"]) <= ATOL and abs(got["grad_norm"] - want["grad_norm"]) <= ATOL
    assert max_diff(got["state"], want["state"]) <= ATOL


def test_targets_that_select_nothing_are_refused_naming_the_key(single: dict) -> None:
    assert single["refusals"] == [
        "policy.megatron_cfg.peft.target_modules: 'q_proj' matches no linear layer of the decoder; its linear layers "
        "end in ['linear_fc1', 'linear_fc2', 'linear_proj', 'linear_qkv']",
        "policy.megatron_cfg.peft.exclude_modules: excludes every targeted layer; nothing would train",
    ]
