"""GRPO on a mixture-of-experts model end to end: the built-in tiny Qwen3-MoE (8 experts, top-2, every layer sparse,
fp32) trained by the DTensor backend, refitted into vLLM-CPU after every step, checkpointed, and resumed.

A reward the tiny model earns (`LENGTH_REWARD`) and a learning rate that moves it make every step update the
weights, so ``token_mult_prob_error`` after each refit checks that the engine serves the trained experts (vLLM's own
in-place reload left them 0.67 off, see tests/unit/test_moe.py), and the resumed step must equal the straight one.
Router replay is on: the engine's routing reaches every training batch (in fp32 it is the trainer's own routing, so
the numbers are those of a run without it; tests/unit/test_moe.py checks both ends against Hugging Face).
"""

from __future__ import annotations

import shutil

import pytest
import torch

from nemo_rl_clone.models.huggingface import TINY_QWEN3_MOE
from tests.functional.supervised_runs import read_metrics, run_dirs
from tests.functional.test_grpo import LENGTH_REWARD, check_smoke_metrics, final_weights, run_grpo

STEPS = 3
MOE_RUN = (
    f"policy.model_name={TINY_QWEN3_MOE}",
    *LENGTH_REWARD,
    "policy.optimizer.kwargs.lr=1e-3",
    "++policy.hf_config_overrides.router_aux_loss_coef=0.01",
    "++policy.router_replay.enabled=true",
    "++grpo.dump_steps=[2]",
    f"grpo.max_num_steps={STEPS}",
    f"grpo.val_period={STEPS}",
)


def test_grpo_trains_refits_and_resumes_a_moe_model_exactly(tmp_path):
    run_grpo(tmp_path, *MOE_RUN)
    (log_dir,) = run_dirs(tmp_path)
    straight = read_metrics(log_dir)
    check_smoke_metrics(straight, STEPS)
    for step in range(1, STEPS + 1):
        m = straight[step]
        assert m["train/grad_norm"] > 0, m  # every step trains, so every refit sends new experts
        # Switch loss over 2 layers: top_k (2.0) when perfectly balanced, more when not; 0.01 of it is in the loss
        assert 1.9 < m["train/router_aux_loss"] < 4.0, m
    batch = torch.load(log_dir / "repro" / "step_2" / "batch.pt", weights_only=False)
    routed = batch["routed_experts"]  # [B, S, layers, k] as the trainer got it
    assert routed.shape == (*batch["input_ids"].shape, 2, 2)
    valid = torch.arange(routed.shape[1]) < batch["input_lengths"][:, None] - 1  # all but each row's last token
    assert (routed[valid] >= 0).all() and (routed[~valid] == -1).all()
    weights = final_weights(tmp_path, STEPS)
    assert any(".mlp.experts.gate_up_proj" in name for name in weights)  # DCP holds the trained (fused) experts

    shutil.rmtree(tmp_path / "ckpt" / f"step_{STEPS}")  # resume from step 2 and run step 3 again
    proc = run_grpo(tmp_path, *MOE_RUN)
    assert "Resuming from checkpoint" in proc.stdout
    resumed = read_metrics(run_dirs(tmp_path)[-1])
    for key in ("train/reward", "train/loss", "train/router_aux_loss", "train/grad_norm"):
        assert resumed[STEPS][key] == pytest.approx(straight[STEPS][key], rel=1e-6, abs=1e-7), key
    again = final_weights(tmp_path, STEPS)
    assert all(torch.equal(again[name], weights[name]) for name in weights)
