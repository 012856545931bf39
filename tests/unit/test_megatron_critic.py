"""PPO's critic and reward models on the Megatron backend (`megatron.value_head`), in spawned gloo processes, against a
plain Hugging Face sequence-classification model and against itself at other parallel layouts.

The tiny random Llama of `test_megatron_policy` (tied embeddings: the critic unties them, its head is ``score``) is
loaded as a 1-label sequence-classification model. Scenarios, each one spawn run once per module:

- ``single`` (one process): a reward model's last-token scores and a Bradley-Terry step; the critic's per-token values, a checkpoint before any
  step, two Adam steps of the
  clipped value loss (``cliprange`` binding on about half the tokens), its values after each, a run checkpoint
  (weights and optimizer) and an HF export after step 1.
- ``tp2_sp`` (two processes, TP=2 with sequence parallelism: the head gathers the split sequence): loads the
  checkpoint ``single`` saved before its first step (no optimizer state yet: PPO's actor while its critic warms up)
  and takes the same steps.
- ``pp2_resumed`` (two pipeline stages): loads ``single``'s step-1 checkpoint and takes step 2.

The values and the first step's loss and gradient norm are checked against Hugging Face and a loss written out here;
the layouts against one process. Tolerance 1e-5 (fp32; the layouts only reorder float sums).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.models.policy.config import PolicyConfig
from nemo_rl_clone.utils.config_validation import validate_config
from tests.unit.test_megatron_policy import ATOL, ROWS, make_batches, max_diff, policy_dict, spawn, tiny_llama_dir

CLIPRANGE = 0.2


def critic_config(model_dir: str, tp: int = 1, pp: int = 1, kind: str = "regression", **megatron: Any) -> PolicyConfig:
    section = {
        **policy_dict(model_dir, tp, pp, **megatron),
        "reward_model_cfg": {"enabled": True, "reward_model_type": kind},
    }
    return validate_config(section, PolicyConfig)


def hf_head_outputs(model_dir: str, input_ids: torch.Tensor, requires_grad: bool = False) -> tuple[Any, torch.Tensor]:
    """(the model, its score head at every position ``[B, S]``): Hugging Face's decoder and ``score`` layer, called
    directly (not through its pooling)."""
    from nemo_rl_clone.models.policy.workers.reward_model import load_reward_model

    model = load_reward_model(model_dir, pad_token_id=0)
    with torch.set_grad_enabled(requires_grad):
        hidden = model.model(input_ids=input_ids).last_hidden_state
        return model, model.score(hidden)[..., 0]


def shifted(outputs: torch.Tensor) -> torch.Tensor:
    """A critic's values: the head at position t − 1 is the value of the state generating token t (0 at t = 0)."""
    return torch.cat([torch.zeros(len(outputs), 1), outputs[:, :-1]], dim=1)


def hand_value_loss(values: torch.Tensor, data: BatchedDataDict) -> torch.Tensor:
    """½ · mean over response tokens of max((V − R)², (clamp(V, V_old ± c) − R)²), written out."""
    mask = data["token_mask"] * data["sample_mask"][:, None]
    old, returns = data["values"], data["returns"]
    clipped = torch.minimum(torch.maximum(values, old - CLIPRANGE), old + CLIPRANGE)
    per_token = torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return 0.5 * (per_token * mask).sum() / mask.sum()


def critic_batches(model_dir: str) -> list[BatchedDataDict]:
    """Two batches with returns and rollout-time values: the first's are the initial critic's plus noise of 0.3, so
    the clip of 0.2 binds on about half of its tokens."""
    generator = torch.Generator().manual_seed(2)
    batches = make_batches()[:2]
    _, initial = hf_head_outputs(model_dir, batches[0]["input_ids"])
    out = []
    for index, batch in enumerate(batches):
        shape = batch["input_ids"].shape
        old = shifted(initial) + 0.3 * torch.randn(shape, generator=generator) if index == 0 else torch.zeros(shape)
        out.append(BatchedDataDict({**batch, "values": old, "returns": torch.randn(shape, generator=generator)}))
    return out


def preference_batch(data: BatchedDataDict) -> BatchedDataDict:
    """``data``'s rows as 4 (chosen, rejected) pairs, every pair valid."""
    return BatchedDataDict({**data, "sample_mask": torch.ones(ROWS)})


def grad_norm_of(model: Any, loss: torch.Tensor) -> float:
    loss.backward()
    return torch.sqrt(sum(p.grad.double().square().sum() for p in model.parameters() if p.grad is not None)).item()


# ---------------------------------------------------------------------------- scenarios (run in the children)
def _worker(model_dir: str, tp: int, pp: int, kind: str = "regression", megatron: dict | None = None, **kw: Any) -> Any:
    from nemo_rl_clone.models.huggingface import load_tokenizer
    from nemo_rl_clone.models.policy.megatron.policy_worker import MegatronPolicyWorker

    config = critic_config(model_dir, tp, pp, kind, **(megatron or {}))
    return MegatronPolicyWorker(config, load_tokenizer(model_dir), model_dir, init_reference_model=False, **kw)


def _value_step(worker: Any, data: BatchedDataDict) -> dict[str, float]:
    from nemo_rl_clone.algorithms.ppo.value_loss import MseValueLossFn

    result = worker.train(data, MseValueLossFn({"cliprange": CLIPRANGE}), gbs=ROWS)
    return {"loss": result["global_loss"].item(), "grad_norm": result["grad_norm"].item()}


def run_single(model_dir: str, run_dir: str, batches: list[BatchedDataDict]) -> dict[str, Any]:
    import os

    from nemo_rl_clone.algorithms.loss import PreferenceLossFn
    from tests.unit.test_megatron_policy import free_port

    reward = _worker(model_dir, 1, 1, "bradley_terry")
    result: dict[str, Any] = {"rm_scores": reward.score(batches[0])["scores"]}
    rm_step = reward.train(preference_batch(batches[0]), PreferenceLossFn(), gbs=ROWS)
    result["rm_step"] = {"loss": rm_step["global_loss"].item(), "grad_norm": rm_step["grad_norm"].item()}
    reward.shutdown()
    os.environ["MASTER_PORT"] = str(free_port())  # a fresh process group for the critic

    worker = _worker(model_dir, 1, 1)
    result["values"] = [worker.score(batches[0])["scores"]]
    # Before any step (PPO's actor during the critic's warm-up): Megatron has no optimizer state to write yet.
    never = Path(run_dir) / "step_0" / "value"
    worker.save_checkpoint(str(never / "weights"), str(never / "optimizer"))
    result["steps"] = [_value_step(worker, batches[0])]
    result["values"].append(worker.score(batches[0])["scores"])
    step_dir = Path(run_dir) / "step_1" / "value"
    worker.save_checkpoint(str(step_dir / "weights"), str(step_dir / "optimizer"), save_hf_path=f"{run_dir}/hf_1")
    result["steps"].append(_value_step(worker, batches[1]))
    result["values"].append(worker.score(batches[0])["scores"])
    worker.shutdown()
    return result


def run_tp2_sp(model_dir: str, run_dir: str, batches: list[BatchedDataDict]) -> dict[str, Any]:
    never = Path(run_dir) / "step_0" / "value"  # saved before any step: loads as a fresh optimizer
    worker = _worker(
        model_dir,
        2,
        1,
        megatron={"sequence_parallel": True},
        weights_path=str(never / "weights"),
        optimizer_path=str(never / "optimizer"),
    )
    result: dict[str, Any] = {"values": [worker.score(batches[0])["scores"]], "steps": []}
    for data in batches:
        result["steps"].append(_value_step(worker, data))
        result["values"].append(worker.score(batches[0])["scores"])
    worker.shutdown()
    return result


def run_pp2_resumed(model_dir: str, run_dir: str, batches: list[BatchedDataDict]) -> dict[str, Any]:
    step_dir = Path(run_dir) / "step_1" / "value"
    worker = _worker(
        model_dir, 1, 2, weights_path=str(step_dir / "weights"), optimizer_path=str(step_dir / "optimizer")
    )
    result = {"loaded_values": worker.score(batches[0])["scores"], "step": _value_step(worker, batches[1])}
    result["values"] = worker.score(batches[0])["scores"]
    worker.shutdown()
    return result


# ---------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def model_dir(module_tmp_path: Path) -> str:
    return tiny_llama_dir(module_tmp_path)


@pytest.fixture(scope="module")
def batches(model_dir: str) -> list[BatchedDataDict]:
    return critic_batches(model_dir)


@pytest.fixture(scope="module")
def run_dir(module_tmp_path: Path) -> Path:
    return module_tmp_path / "critic_run"


@pytest.fixture(scope="module")
def single(model_dir: str, run_dir: Path, batches: list[BatchedDataDict]) -> dict[str, Any]:
    return spawn(1, run_single, model_dir, str(run_dir), batches, writes=run_dir)


@pytest.fixture(scope="module")
def tp2_sp(single: dict, model_dir: str, run_dir: Path, batches: list[BatchedDataDict]) -> dict[str, Any]:
    return spawn(2, run_tp2_sp, model_dir, str(run_dir), batches)


@pytest.fixture(scope="module")
def pp2_resumed(single: dict, model_dir: str, run_dir: Path, batches: list[BatchedDataDict]) -> dict[str, Any]:
    return spawn(2, run_pp2_resumed, model_dir, str(run_dir), batches)


# ---------------------------------------------------------------------------- tests
def test_scores_equal_the_hugging_face_head(single: dict, model_dir: str, batches: list) -> None:
    """A critic's values are the score head one position back; a reward model's score is the head at the last
    valid token of each row (not where Hugging Face's pooling would look for the pad id)."""
    data = batches[0]
    _, outputs = hf_head_outputs(model_dir, data["input_ids"])
    assert single["values"][0].shape == data["input_ids"].shape
    assert max_diff(single["values"][0], shifted(outputs)) <= ATOL
    last = outputs[torch.arange(ROWS), data["input_lengths"] - 1]
    assert single["rm_scores"].shape == (ROWS,)
    assert max_diff(single["rm_scores"], last) <= ATOL


def test_first_step_loss_and_gradient_norm_equal_a_hand_computation(single: dict, model_dir: str, batches: list):
    """The clipped value loss of the initial critic and the norm of its gradient over every parameter (head and
    decoder), by autograd through Hugging Face's model."""
    data = batches[0]
    model, outputs = hf_head_outputs(model_dir, data["input_ids"], requires_grad=True)
    values = shifted(outputs)
    mask = data["token_mask"] * data["sample_mask"][:, None]
    old = data["values"]
    binding = ((values - old).abs() > CLIPRANGE) & (mask > 0)
    assert 0.2 < binding.sum() / (mask > 0).sum() < 0.8  # the clip really binds on part of the tokens
    loss = hand_value_loss(values, data)
    grad_norm = grad_norm_of(model, loss)
    step = single["steps"][0]
    assert abs(step["loss"] - loss.item()) <= ATOL
    assert abs(step["grad_norm"] - grad_norm) <= ATOL * max(1.0, grad_norm)
    assert max_diff(single["values"][1], single["values"][0]) > 1e-3  # the step moved the critic


def test_reward_model_step_equals_a_hand_computed_bradley_terry_loss(single: dict, model_dir: str, batches: list):
    """−log σ(s_chosen − s_rejected) over the 4 pairs, by autograd through Hugging Face's model."""
    data = batches[0]
    model, outputs = hf_head_outputs(model_dir, data["input_ids"], requires_grad=True)
    scores = outputs[torch.arange(ROWS), data["input_lengths"] - 1]
    loss = -torch.nn.functional.logsigmoid(scores[::2] - scores[1::2]).mean()
    grad_norm = grad_norm_of(model, loss)
    assert abs(single["rm_step"]["loss"] - loss.item()) <= ATOL
    assert abs(single["rm_step"]["grad_norm"] - grad_norm) <= ATOL * max(1.0, grad_norm)


def test_tensor_and_sequence_parallel_critic_trains_like_one_process(tp2_sp: dict, single: dict) -> None:
    for got, want in zip(tp2_sp["values"], single["values"], strict=True):
        assert max_diff(got, want) <= ATOL
    for got, want in zip(tp2_sp["steps"], single["steps"], strict=True):
        assert abs(got["loss"] - want["loss"]) <= ATOL and abs(got["grad_norm"] - want["grad_norm"]) <= ATOL


def test_checkpoint_resumes_on_two_pipeline_stages(pp2_resumed: dict, single: dict) -> None:
    assert max_diff(pp2_resumed["loaded_values"], single["values"][1]) <= ATOL
    got, want = pp2_resumed["step"], single["steps"][1]
    assert abs(got["loss"] - want["loss"]) <= ATOL and abs(got["grad_norm"] - want["grad_norm"]) <= ATOL
    assert max_diff(pp2_resumed["values"], single["values"][2]) <= ATOL


def test_hf_export_is_a_sequence_classifier_with_the_trained_values(single: dict, run_dir: Path, batches: list):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(run_dir / "hf_1", dtype=torch.float32).eval()
    assert type(model).__name__ == "LlamaForSequenceClassification" and model.config.num_labels == 1
    with torch.no_grad():
        outputs = model.score(model.model(input_ids=batches[0]["input_ids"]).last_hidden_state)[..., 0]
    assert max_diff(shifted(outputs), single["values"][1]) <= ATOL
