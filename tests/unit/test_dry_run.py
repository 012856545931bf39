"""``--dry-run`` through the entry points' own ``main``: the plan, and each pre-flight failure as its one line.

Every case runs in-process (no Ray, no vLLM): a dry run must start neither, and must create no directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scripts import entry_point_main

REPO = Path(__file__).resolve().parents[2]
# A template that shows only the last assistant reply in full (like templates dropping earlier reasoning): templating
# turn by turn diverges from templating the whole conversation once a second user turn follows.
NOT_APPEND_ONLY = (
    "{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}<|im_start|>assistant\n[earlier]"
    "<|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(autouse=True)
def _ray_not_started() -> None:
    """Each case starts with this process disconnected from Ray (an earlier module on this worker may have connected
    it), so that the checks that a dry run starts no Ray, and looks at this machine, mean what they say."""
    import ray

    ray.shutdown()


def dirs_args(tmp_path: Path) -> list[str]:
    return [f"logger.log_dir={tmp_path / 'logs'}", f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}"]


def fails_with(capsys, main, args: list[str], line: str) -> None:
    """``main(args)`` exits 2 with exactly one ``error:`` line, equal to ``line`` (or starting with it, for a line
    ending in machine-dependent numbers given as ``...``)."""
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    errors = [text for text in capsys.readouterr().err.splitlines() if text.startswith("error:")]
    assert len(errors) == 1, errors
    if line.endswith("..."):
        assert errors[0].startswith(line[:-3]), errors[0]
    else:
        assert errors[0] == line


def test_main_job_dry_run_prints_the_plan_and_writes_nothing(tmp_path, capsys):
    entry_point_main("run_grpo_math")(["--dry-run", *dirs_args(tmp_path)])
    out = capsys.readouterr().out
    assert "1000 training rows, 96 validation rows" in out
    assert "append-only over 3 turns" in out
    assert "134.5 M parameters" in out
    for row in ("parameters", "gradients", "optimizer", "activations", "logits", "kv cache", "runtime", "total"):
        assert row in out, row
    assert "policy worker ×1/node" in out and "generation engine ×1/node" in out
    assert "Planned step time, s" in out  # the time plan: colocated (this config) and split, bound and half
    for row in ("generation", "logprobs", "training", "weight sync", "step", "validation share"):
        assert row in out, row
    assert "A: colocated (this config)" in out and "B: split: " in out
    assert "Rates: cpu:" in out
    assert "dry run: no problems found" in out
    assert list(tmp_path.iterdir()) == []  # no log or checkpoint directory
    import ray

    assert not ray.is_initialized()


@pytest.mark.parametrize(
    "name", ["run_sft", "run_dpo", "run_rm", "run_grpo", "run_grpo_sliding_puzzle", "run_distillation_math"]
)
def test_every_training_entry_point_has_a_dry_run(name, tmp_path, capsys):
    entry_point_main(name)(["--dry-run", *dirs_args(tmp_path)])  # each on its shipped config
    out = capsys.readouterr().out
    assert "training rows" in out and "Planned peak memory per worker" in out
    assert "dry run: no problems found" in out
    assert list(tmp_path.iterdir()) == []


def test_eval_dry_run(tmp_path, capsys):
    problems = tmp_path / "problems.jsonl"
    problems.write_text('{"problem": "What is 2 + 3?", "answer": "5"}\n')
    entry_point_main("run_eval")(
        [
            "--dry-run",
            f"eval.save_path={tmp_path / 'out' / 'samples.jsonl'}",
            "generation.model_name=SmolLM2-135M-Instruct",
            "data.dataset_name=local",
            f"data.data_path={problems}",
        ]
    )
    out = capsys.readouterr().out
    assert "generation engine" in out and "dry run: no problems found" in out
    assert list(tmp_path.iterdir()) == [problems]


def test_config_problem(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        entry_point_main("run_grpo_math")(["--dry-run", *dirs_args(tmp_path), "grpo.num_prompts_per_step=0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["Invalid config (1 problem):", "  grpo.num_prompts_per_step: must be >= 1, got 0"]


def test_missing_model(tmp_path, capsys):
    missing = tmp_path / "no_model"
    fails_with(
        capsys,
        entry_point_main("run_grpo_math"),
        ["--dry-run", *dirs_args(tmp_path), f"policy.model_name={missing}"],
        f"error: policy.model_name: model folder {str(missing)!r} does not exist (a local model folder or a "
        "built-in model: ...",
    )


def test_missing_data_file(tmp_path, capsys):
    missing = tmp_path / "train.jsonl"
    fails_with(
        capsys,
        entry_point_main("run_sft"),
        [
            "--dry-run",
            *dirs_args(tmp_path),
            "data.dataset_name=openai_format",
            f"data.data_path={missing}",
            "data.split_validation_size=0.1",
        ],
        f"error: data.data_path: data file {str(missing)!r} does not exist",
    )


def test_chat_template_not_append_only_fails_a_multi_turn_run(tmp_path, capsys):
    template = f"++policy.tokenizer.chat_template={NOT_APPEND_ONLY!r}"
    fails_with(
        capsys,
        entry_point_main("run_grpo_sliding_puzzle"),
        ["--dry-run", *dirs_args(tmp_path), template],
        "error: chat template of 'SmolLM2-135M-Instruct' is not append-only: it renders the earlier turns "
        "differently once turn 3 (user) follows, so observations cannot be appended turn by turn",
    )


def test_cluster_too_large(tmp_path, capsys):
    batch = ["grpo.num_prompts_per_step=256", "policy.train_global_batch_size=1024"]  # 1,024 workers' worth
    fails_with(
        capsys,
        entry_point_main("run_grpo_math"),
        ["--dry-run", *dirs_args(tmp_path), "cluster.gpus_per_node=1024", *batch],
        "error: cluster.gpus_per_node * cluster.num_nodes (1024): 1024 worker slots, each needs one CPU, and this "
        "machine has ...",
    )


def test_memory_does_not_fit(tmp_path, capsys):
    fails_with(
        capsys,
        entry_point_main("run_grpo_math"),
        ["--dry-run", *dirs_args(tmp_path), "policy.generation.vllm_cfg.kv_cache_memory_bytes=100000000000000"],
        "error: memory: the plan needs ...",
    )
