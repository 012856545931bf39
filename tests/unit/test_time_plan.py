"""The dry run's time plan: each phase's formula against a hand computation with given rates, the layouts, and the
rate cache's re-probe rules (age, drift). The probe itself runs on a tiny shape (a fraction of a second)."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from nemo_rl_clone.models import machine_rates as mr
from nemo_rl_clone.models.memory_estimate import ModelShape
from nemo_rl_clone.models.time_estimate import Layout, Rollout, StepWork, generation_s, step_time

# hidden 8, 2 layers, MLP 16, vocabulary 32, 2 heads of 4, 1 KV head.
SHAPE = ModelShape(
    num_parameters=1000,
    num_layers=2,
    hidden_size=8,
    intermediate_size=16,
    vocab_size=32,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=4,
    tied_embeddings=True,
)
RATES = mr.MachineRates(
    device="cpu: test",
    threads=2,
    train_gflops=1e-6,  # 1,000 FLOP/s: FLOP counts read directly as milliseconds
    decode_fixed_s=0.01,
    decode_row_s=0.001,
    memory_gbps=1e-6,  # 1,000 B/s
    copy_gbps=1e-6,
    engine_prepare_s_per_param=1e-3,
    adam_s_per_param=1e-4,
    quick_gflops=100.0,
    measured_at=time.time(),
)
# Per token, by hand: q 8×8, k 8×4, v 8×4, o 8×8, gate and up 8×16, down 16×8 = 64+32+32+64+384 = 576 weights per
# layer, 1,152 for both; forward 2 FLOPs per weight. Attention: 4 × layers × heads × head_dim = 64 FLOPs per
# earlier position. Head: 2 × 8 × 32 = 512. KV cache: 2 × 1 head × 4 × 2 layers × 4 B = 64 B per position (fp32).
LINEAR, ATTENTION, HEAD, KV = 2 * 1152, 64, 512, 64


def test_generation_by_hand():
    rollout = Rollout(rows=4, prompt_tokens=6, response_tokens=10, max_new_tokens=16)
    decode = 16 * 0.01 + 40 * 0.001  # the longest response's steps, then each generated token's row share
    attention = 40 * (6 + 5) * KV / 1000  # each token reads the prompt and half its response so far
    prefill = (4 * 6 * (LINEAR + ATTENTION * 3) + 4 * HEAD) / 1000  # the head at each prompt's last position
    expected = decode + attention + prefill
    assert generation_s(SHAPE, rollout, RATES, "float32", max_num_seqs=256) == pytest.approx(expected, rel=1e-12)
    # max_num_seqs 2: 40 tokens two at a time take 20 steps, more than the longest response's 16.
    capped = generation_s(SHAPE, rollout, RATES, "float32", max_num_seqs=2)
    assert capped - generation_s(SHAPE, rollout, RATES, "float32", 256) == pytest.approx(4 * 0.01)


def test_step_by_hand():
    rollout = Rollout(rows=4, prompt_tokens=6, response_tokens=10, max_new_tokens=16)
    work = StepWork(rollout, trained_samples=2, logprob_passes=1)
    times = step_time(SHAPE, work, Layout("colocated"), RATES, RATES, "float32", 256)
    forward = 4 * 16 * (LINEAR + ATTENTION * 8) + 4 * 10 * HEAD  # all tokens; the head at response tokens only
    assert times["logprobs"] == pytest.approx(forward / 1000)
    train = 3 * (2 * 16 * (LINEAR + ATTENTION * 8) + 2 * 10 * HEAD) / 1000 + 1000 * 1e-4
    assert times["training"] == pytest.approx(train)
    assert times["weight_sync"] == pytest.approx(2 * 1000 * 4 / 1000 + 1000 * 1e-3)  # gathered, loaded, prepared
    assert times["step"] == pytest.approx(sum(times[k] for k in ("generation", "logprobs", "training", "weight_sync")))
    head_everywhere = step_time(SHAPE, work, Layout("colocated"), RATES, RATES, "float32", 256, head_at_loss_only=False)
    assert head_everywhere["logprobs"] - times["logprobs"] == pytest.approx(4 * 6 * HEAD / 1000)


def test_split_layouts_use_each_sides_rates_and_async_overlaps():
    rollout = Rollout(rows=4, prompt_tokens=6, response_tokens=10, max_new_tokens=16)
    work = StepWork(rollout, trained_samples=4, logprob_passes=0)
    whole = step_time(SHAPE, work, Layout("colocated"), RATES, RATES, "float32", 256)
    slow = dataclasses.replace(RATES, train_gflops=RATES.train_gflops / 2, decode_fixed_s=0.03, decode_row_s=0.002)
    split = step_time(SHAPE, work, Layout("split"), slow, RATES, "float32", 256)  # the trainer on fewer cores
    assert split["generation"] == pytest.approx(whole["generation"])
    assert split["training"] - 1000 * 1e-4 == pytest.approx(2 * (whole["training"] - 1000 * 1e-4))
    slow_decode = dataclasses.replace(RATES, decode_fixed_s=0.03, decode_row_s=0.002)
    engine_slow = step_time(SHAPE, work, Layout("split"), RATES, slow_decode, "float32", 256)
    assert engine_slow["generation"] - whole["generation"] == pytest.approx(16 * 0.02 + 40 * 0.001)
    overlapped = step_time(SHAPE, work, Layout("async", overlap=True), slow, RATES, "float32", 256)
    assert overlapped["step"] == pytest.approx(max(split["generation"], split["training"]) + split["weight_sync"])
    # Two data-parallel engines on GPU: each generates half the rows; two trainers each train half the tokens.
    two = step_time(SHAPE, work, Layout("gpu", policy_workers=2, engines=2), RATES, RATES, "float32", 256)
    assert two["generation"] == pytest.approx(
        generation_s(SHAPE, Rollout(2, 6, 10, 16), RATES, "float32", 256), rel=1e-12
    )
    assert two["training"] - 500 * 1e-4 == pytest.approx((whole["training"] - 1000 * 1e-4) / 2)


def test_validation_share_spreads_each_batch_over_the_period():
    rollout = Rollout(rows=4, prompt_tokens=6, response_tokens=10, max_new_tokens=16)
    val = Rollout(rows=8, prompt_tokens=6, response_tokens=10, max_new_tokens=16)
    work = StepWork(rollout, 4, 0, validation=val, val_batches=3, val_period=5)
    times = step_time(SHAPE, work, Layout("colocated"), RATES, RATES, "float32", 256)
    assert times["validation"] == pytest.approx(3 * generation_s(SHAPE, val, RATES, "float32", 256))
    assert times["validation_share"] == pytest.approx(times["validation"] / 5)


TINY = ModelShape(
    num_parameters=50_000,
    num_layers=2,
    hidden_size=32,
    intermediate_size=64,
    vocab_size=256,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
)


def test_rates_are_probed_once_then_cached_until_old_or_drifted(tmp_path, monkeypatch):
    monkeypatch.setenv("NRL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(mr, "quick_gflops", lambda: 100.0)  # a steady machine: drift is planted below
    monkeypatch.setattr(mr, "STREAM_BYTES", 2**20)
    monkeypatch.setattr(mr, "ADAM_PROBE_PARAMS", 2**16)
    rates, source = mr.machine_rates(TINY, "float32", "float32", 64, 4)
    assert source.startswith("probed now (no cached entry")
    assert rates.train_gflops > 0 and rates.decode_fixed_s > 0 and rates.decode_row_s > 0
    again, source = mr.machine_rates(TINY, "float32", "float32", 64, 4)
    assert source.startswith("cached") and again == rates
    entries = json.loads(mr.cache_path().read_text())
    (key,) = entries
    entries[key]["quick_gflops"] *= 3  # another, faster machine measured it
    mr.cache_path().write_text(json.dumps(entries))
    _, source = mr.machine_rates(TINY, "float32", "float32", 64, 4)
    assert "a quick matmul ran" in source
    entries = json.loads(mr.cache_path().read_text())
    entries[key]["measured_at"] -= 2 * mr.MAX_AGE_S
    mr.cache_path().write_text(json.dumps(entries))
    _, source = mr.machine_rates(TINY, "float32", "float32", 64, 4)
    assert "old" in source
    _, source = mr.machine_rates(TINY, "float32", "bfloat16", 64, 4)  # other shapes or precisions: their own entry
    assert source.startswith("probed now (no cached entry")
    assert len(json.loads(mr.cache_path().read_text())) == 2


def test_an_moe_token_runs_its_share_of_the_routed_experts():
    """Qwen3-MoE style: 8 experts, top 2 — a token's forward counts the dense weights and a quarter of the experts'."""
    moe = dataclasses.replace(
        SHAPE, num_parameters=1000 + 32 * 8 + 4096, num_expert_parameters=4096, active_expert_fraction=0.25
    )
    from nemo_rl_clone.models.time_estimate import forward_flops_per_token

    dense = 1000  # all parameters but the (tied) 32 x 8 embedding table and the experts
    assert forward_flops_per_token(moe, 0) == pytest.approx(2 * (dense + 4096 * 0.25))
