"""What the Ray-backed policy tests compare with: a small batch of real text, the test policy config, and a plain
single-process Hugging Face + AdamW reference (the unsharded computation every sharded run must reproduce)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.models.policy.config import OptimizerConfig, PolicyConfig

TEXTS = [
    "The capital of France is Paris.",
    "Two plus two equals four, said the teacher to the class.",
    "Hello!",
    "A quick brown fox jumps over the lazy dog near the river bank.",
    "def add(a, b): return a + b",
    "Rain.",
    "Numbers: 1 2 3 4 5 6 7 8",
    "The end of the story was unexpected.",
]
PROMPT_TOKENS = 2  # the first tokens of each row are "prompt": not trained on
MASKED_SAMPLE = 5  # sample_mask = 0: contributes nothing
LR, WEIGHT_DECAY, MAX_GRAD_NORM = 1e-3, 0.01, 1.0


def make_batch(tokenizer: Any) -> BatchedDataDict:
    """8 right-padded rows of different lengths, token and sample masks."""
    tokenizer.padding_side = "right"
    encoded = tokenizer(TEXTS, padding=True, return_tensors="pt")
    valid = encoded["attention_mask"].bool()
    positions = torch.arange(valid.shape[1])
    sample_mask = torch.ones(len(TEXTS))
    sample_mask[MASKED_SAMPLE] = 0
    return BatchedDataDict(
        input_ids=encoded["input_ids"],
        input_lengths=valid.sum(dim=1),
        token_mask=(valid & (positions >= PROMPT_TOKENS)).float(),
        sample_mask=sample_mask,
    )


def policy_config(model_path: str, **overrides: Any) -> PolicyConfig:
    config = PolicyConfig(
        model_name=model_path,
        train_global_batch_size=8,
        train_micro_batch_size=2,
        logprob_batch_size=3,
        precision="float32",
        max_grad_norm=MAX_GRAD_NORM,
        optimizer=OptimizerConfig(
            "torch.optim.AdamW", {"lr": LR, "weight_decay": WEIGHT_DECAY, "betas": [0.9, 0.999], "eps": 1e-8}
        ),
    )
    dtensor_overrides = {k[len("dtensor_") :]: overrides.pop(k) for k in list(overrides) if k.startswith("dtensor_")}
    config = replace(config, **overrides)
    config.dtensor_cfg = replace(config.dtensor_cfg, **dtensor_overrides)
    return config


def hf_logprobs(model: torch.nn.Module, data: BatchedDataDict) -> torch.Tensor:
    """[B, S] policy-layout logprobs from one full-batch forward of a plain HF model."""
    input_ids = data["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits.float()
    next_token = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    logprobs = torch.cat([torch.zeros(len(input_ids), 1), next_token], dim=1)
    positions = torch.arange(input_ids.shape[1])
    return torch.where(positions < data["input_lengths"][:, None], logprobs, 0.0)


class ReferenceTrainer:
    """Plain HF model + AdamW + NeMo-RL's default LinearLR→ConstantLR schedule, whole batch in one forward."""

    def __init__(self, model_path: str, model: torch.nn.Module | None = None) -> None:
        """``model``: train this one instead of the plain HF model at ``model_path`` (its trainable parameters)."""
        self.model = model or AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.optimizer = torch.optim.AdamW(
            [param for param in self.model.parameters() if param.requires_grad],
            lr=LR,
            weight_decay=WEIGHT_DECAY,
            betas=(0.9, 0.999),
            eps=1e-8,
        )
        warmup = torch.optim.lr_scheduler.LinearLR(self.optimizer, start_factor=0.1, end_factor=1.0, total_iters=50)
        constant = torch.optim.lr_scheduler.ConstantLR(self.optimizer, factor=1.0, total_iters=10_000_000_000)
        self.scheduler = torch.optim.lr_scheduler.SequentialLR(self.optimizer, [warmup, constant], milestones=[50])

    def step(self, data: BatchedDataDict) -> tuple[float, float]:
        input_ids = data["input_ids"]
        logits = self.model(input_ids=input_ids).logits.float()
        logprobs = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        mask = data["token_mask"][:, 1:] * data["sample_mask"][:, None]
        loss = -(logprobs * mask).sum() / mask.sum()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), MAX_GRAD_NORM)
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.scheduler.step()
        return loss.item(), grad_norm.item()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: tensor.detach().clone() for name, tensor in self.model.state_dict().items()}


def reference_run(model_path: str, batch: BatchedDataDict, steps: int) -> dict[str, Any]:
    """The reference's initial logprobs, then ``steps`` steps on ``batch``: (loss, grad norm) and the state after
    each."""
    trainer = ReferenceTrainer(model_path)
    initial_logprobs = hf_logprobs(trainer.model, batch)
    losses, states = [], []
    for _ in range(steps):
        losses.append(trainer.step(batch))
        states.append(trainer.state_dict())
    return {"initial_logprobs": initial_logprobs, "steps": losses, "states": states}


def max_state_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[name].float() - b[name].float()).abs().max().item() for name in a)


def spawned_dtensor_worker(
    model_dir: str, rows: int, dtensor_cfg: dict[str, Any], policy_extra: dict[str, Any] | None = None, **kwargs: Any
) -> Any:
    """In a `spawn`ed child: a fresh process group and a `DTensorPolicyWorker` of ``rows`` rows a step (fp32, AdamW
    with eps 1e-6, clipping at 1, no scheduler, no reference model), ``dtensor_cfg`` and ``policy_extra`` on top.
    Adam's eps at 1e-6: with 1e-8 the normalised step of a near-zero gradient (a tied embedding's unused rows) turns
    float noise into ~5e-6 of weight, too close to the layout tests' tolerances."""
    import os

    from nemo_rl_clone.models.huggingface import load_tokenizer
    from nemo_rl_clone.models.policy.dtensor.policy_worker import DTensorPolicyWorker
    from nemo_rl_clone.utils.config_validation import validate_config

    policy = {
        "model_name": model_dir,
        "precision": "float32",
        "train_global_batch_size": rows,
        "train_micro_batch_size": 2,
        "logprob_batch_size": 3,
        "max_grad_norm": 1.0,
        "scheduler": None,
        "optimizer": {"name": "torch.optim.AdamW", "kwargs": {"lr": 1e-3, "weight_decay": 0.01, "eps": 1e-6}},
        "dtensor_cfg": dtensor_cfg,
        **(policy_extra or {}),
    }
    os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + 1)  # a fresh process group per worker
    config = validate_config(policy, PolicyConfig)
    return DTensorPolicyWorker(config, load_tokenizer(model_dir), model_dir, init_reference_model=False, **kwargs)


def spawned_train_step(worker: Any, data: BatchedDataDict, rows: int) -> dict[str, Any]:
    """One NLL step of a `spawned_dtensor_worker` on this rank's half of ``data`` (2 ranks): loss, grad norm, the
    step's metrics, and (rank 0) a copy of the full weights (with one shard per rank the full tensor can be the live
    parameter itself)."""
    import os

    from nemo_rl_clone.algorithms.loss import NLLLossFn

    result = worker.train(data.shard_by_batch_size(2)[int(os.environ["RANK"])], NLLLossFn(), gbs=rows)
    state = worker.get_full_state_dict_for_refit()
    return {
        "loss": result["global_loss"].item(),
        "grad_norm": result["grad_norm"].item(),
        "metrics": result["all_mb_metrics"],
        "state": {name: tensor.clone() for name, tensor in state.items()} if state is not None else None,
    }
