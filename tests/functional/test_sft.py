"""SFT end to end on CPU (real Ray, FSDP2, `datasets`): `configs/sft_smoke.yaml` through `examples/run_sft.py`.

A tiny random model trains on 8 short conversations in the OpenAI-messages JSONL format, one global batch of all 8
per step: the training loss must fall, a restart from the run's step-2 checkpoint must continue exactly as the
run did, and the smoke config's packed microbatches must train exactly as padded ones, and so must sequences split
over 2 context-parallel workers. The same with LoRA, plus its exports.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.functional.supervised_runs import (
    assert_checkpoint,
    assert_trains_alike,
    read_metrics,
    run_dirs,
    run_entry_point,
    run_keeping_checkpoint,
    write_jsonl,
)

CONVERSATIONS = [
    ("What is 2 + 3?", "2 + 3 = 5."),
    ("Name a primary colour.", "Red is a primary colour."),
    ("What is the capital of France?", "The capital of France is Paris."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("Spell the word cat backwards.", "Backwards, cat is tac."),
    ("What is 10 minus 4?", "10 minus 4 is 6."),
    ("Which planet is closest to the sun?", "Mercury is closest to the sun."),
    ("What do bees make?", "Bees make honey."),
]


def fixed_set_overrides(tmp_path) -> list[str]:
    rows = [
        {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in CONVERSATIONS
    ]
    path = write_jsonl(tmp_path / "chats.jsonl", rows)
    return [
        "data.dataset_name=openai_format",
        f"data.data_path={path}",
        f"data.val_data_path={path}",
        "sft.max_num_epochs=100",
        "policy.train_global_batch_size=8",
        "policy.train_micro_batch_size=4",
        "sft.val_period=5",
        "sft.val_global_batch_size=8",
        "sft.val_micro_batch_size=4",
    ]


@pytest.mark.slow
def test_sft_learns_writes_metrics_and_resumes_exactly(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    straight.mkdir(), resumed.mkdir()
    data = fixed_set_overrides(tmp_path)

    # The restart below resumes from this run's own step-2 checkpoint, kept the moment it is saved.
    run_keeping_checkpoint(
        "sft",
        straight,
        2,
        resumed / "ckpt" / "step_2",
        *data,
        "sft.max_num_steps=10",
        "sft.val_at_start=true",
        "checkpointing.save_period=2",
        "checkpointing.keep_top_k=1",
        "checkpointing.metric_name=null",  # keep the newest
    )
    (straight_dir,) = run_dirs(straight)
    expected = read_metrics(straight_dir)
    for step in range(1, 11):
        for key in (
            "train/loss",
            "train/grad_norm",
            "train/lr",
            "train/num_valid_samples",
            "timing/train/policy_training",
            "timing/train/total_step_time",
        ):
            assert key in expected[step], (step, key, sorted(expected[step]))
        assert expected[step]["train/num_valid_samples"] == 8
    losses = [expected[step]["train/loss"] for step in range(1, 11)]
    # A random model starts near ln(vocab) = ln(49152) = 10.8 and memorises 8 short answers quickly.
    assert losses[0] == pytest.approx(10.8, abs=0.3), losses
    assert losses[-1] < losses[0] - 2.5, losses
    val = {step: expected[step]["validation/val_loss"] for step in (0, 5, 10)}
    assert val[10] < val[5] < val[0], val

    # The smoke config packs each microbatch into one row (policy.sequence_packing); padded rows train the same.
    assert {expected[step]["performance/train_padding_fraction"] for step in range(1, 11)} == {0.0}
    padded = assert_trains_alike("sft", tmp_path / "padded", expected, *data, "policy.sequence_packing.enabled=false")
    padding = [padded[step]["performance/train_padding_fraction"] for step in range(1, 4)]
    assert min(padding) > 0.02, padding  # there was padding to remove, so the equality above means something
    # Each sequence split over 2 context-parallel workers (ring attention) trains as the whole sequence on one.
    cp = [
        "policy.sequence_packing.enabled=false",
        "policy.dtensor_cfg.context_parallel_size=2",
        "cluster.gpus_per_node=2",
    ]
    assert_trains_alike("sft", tmp_path / "context_parallel", padded, *data, *cp)

    # keep_top_k=1: only the last checkpoint stays (the one kept for the restart is a hard-linked copy).
    assert sorted(p.name for p in (straight / "ckpt").iterdir()) == ["step_10"]
    assert_checkpoint(resumed / "ckpt" / "step_2")
    proc = run_entry_point("sft", resumed, *data, "sft.max_num_steps=4")
    assert "Resuming from checkpoint" in proc.stdout and "step_2 (step 2)" in proc.stdout
    # The progress bar's phase lines, and the bar itself (printed once at the end when not on a terminal).
    assert "step 3: training" in proc.stdout and "step 4: checkpoint" in proc.stdout
    assert "SFT step 4: done" in proc.stdout and "4/4" in proc.stdout
    (resumed_dir,) = run_dirs(resumed)
    got = read_metrics(resumed_dir)
    assert sorted(s for s in got if "train/loss" in got[s]) == [3, 4]  # the restart continued at step 3
    for step in (3, 4):
        # Restored weights, optimizer, scheduler, loader position and RNG: the same losses to fp32 noise.
        assert got[step]["train/loss"] == pytest.approx(expected[step]["train/loss"], abs=1e-5), step
        assert got[step]["train/grad_norm"] == pytest.approx(expected[step]["train/grad_norm"], rel=1e-4), step
        assert got[step]["train/lr"] == pytest.approx(expected[step]["train/lr"], rel=1e-9), step


@pytest.mark.slow
def test_sft_lora_learns_resumes_and_exports(tmp_path):
    """LoRA (policy.dtensor_cfg.lora_cfg) through the entry point: the loss falls, checkpoints hold only the adapters
    and resume exactly, and both exports (merged model, peft adapter) compute the same logits."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from nemo_rl_clone.evals.checkpoint import convert_checkpoint_to_hf
    from nemo_rl_clone.models.hf_export import load_dcp_model_state_dict
    from nemo_rl_clone.models.huggingface import TINY_LLAMA, resolve_model_path
    from nemo_rl_clone.models.policy.dtensor.lora import is_adapter_key
    from tests.functional.supervised_runs import REPO

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    straight.mkdir(), resumed.mkdir()
    data = [
        *fixed_set_overrides(tmp_path),
        "policy.dtensor_cfg.lora_cfg.enabled=true",
        "policy.optimizer.kwargs.lr=2e-2",
    ]
    step_dir = resumed / "ckpt" / "step_2"
    run_keeping_checkpoint("sft", straight, 2, step_dir, *data, "sft.max_num_steps=4")
    expected = read_metrics(run_dirs(straight)[0])
    losses = [expected[step]["train/loss"] for step in range(1, 5)]
    assert losses[-1] < losses[0] - 0.5, losses

    assert_checkpoint(step_dir)
    adapters = load_dcp_model_state_dict(step_dir / "policy" / "weights")
    assert len(adapters) == 2 * 2 * 7 and all(is_adapter_key(name) for name in adapters)  # A and B, 14 layers
    run_entry_point("sft", resumed, *data, "sft.max_num_steps=4")
    (resumed_dir,) = run_dirs(resumed)
    got = read_metrics(resumed_dir)
    assert sorted(s for s in got if "train/loss" in got[s]) == [3, 4]
    for step in (3, 4):
        assert got[step]["train/loss"] == pytest.approx(expected[step]["train/loss"], abs=1e-5), step
        assert got[step]["train/grad_norm"] == pytest.approx(expected[step]["train/grad_norm"], rel=1e-4), step

    converter = REPO / "examples" / "converters" / "convert_lora_to_hf.py"
    args = ["--config", str(step_dir / "config.yaml"), "--dcp-ckpt-path", str(step_dir / "policy" / "weights")]
    for out, extra in ((tmp_path / "merged", []), (tmp_path / "adapter", ["--adapter-only"])):
        proc = subprocess.run(
            [sys.executable, str(converter), *args, "--hf-ckpt-path", str(out), *extra], capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    input_ids = torch.tensor([[5, 17, 42, 8, 99, 3, 64, 21]])
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)(input_ids).logits
        base = AutoModelForCausalLM.from_pretrained(resolve_model_path(TINY_LLAMA), dtype=torch.float32)
        base_logits = base(input_ids).logits
        with_adapter = PeftModel.from_pretrained(base, str(tmp_path / "adapter"))(input_ids=input_ids).logits
    torch.testing.assert_close(with_adapter, merged, atol=1e-5, rtol=0)
    assert (merged - base_logits).abs().max() > 1e-2  # the adapters moved the model
    # Evaluating the checkpoint converts it the same way (merged into policy/hf).
    policy_cfg = yaml.safe_load((step_dir / "config.yaml").read_text())["policy"]
    evaluated = convert_checkpoint_to_hf(step_dir, policy_cfg, tmp_path / "eval_hf")
    with torch.no_grad():
        eval_logits = AutoModelForCausalLM.from_pretrained(evaluated, dtype=torch.float32)(input_ids).logits
    torch.testing.assert_close(eval_logits, merged, atol=0, rtol=0)


def test_sft_nemo_rl_v07_layout_no_step_limit_and_validation_at_end(tmp_path):
    """NeMo-RL v0.7.0's nested data layout, ``max_num_steps: -1`` (the epochs end the run) and ``val_at_end``."""
    rows = [
        {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in CONVERSATIONS
    ]
    path = write_jsonl(tmp_path / "chats.jsonl", rows)
    overrides = [
        "++data.train.dataset_name=openai_format",
        f"++data.train.data_path={path}",
        f"++data.validation.data_path={path}",
        "++data.add_bos=true",
        "++data.add_eos=true",
        "sft.max_num_steps=-1",
        "sft.max_num_epochs=3",
        "sft.val_period=2",
        "++sft.val_at_end=true",
        "sft.val_global_batch_size=8",
        "sft.val_micro_batch_size=4",
        "policy.train_global_batch_size=8",
        "policy.train_micro_batch_size=4",
        "checkpointing.enabled=false",
    ]
    run_entry_point("sft", tmp_path, *overrides)
    (run_dir,) = run_dirs(tmp_path)
    metrics = read_metrics(run_dir)
    assert sorted(step for step, m in metrics.items() if "train/loss" in m) == [1, 2, 3]  # 3 epochs of one batch
    assert sorted(step for step, m in metrics.items() if "validation/val_loss" in m) == [2, 3]
