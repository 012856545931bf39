"""Run state in checkpoints: validation metrics belong to their own step (keep_top_k), and a checkpoint records the
model it holds so that a run of another model refuses to resume from it. Real files, real model configs."""

from __future__ import annotations

import pytest
import torch

from nemo_rl_clone.algorithms.run.state import (
    DATALOADER_FILE,
    RunState,
    check_checkpoint_model,
    model_identity,
    restore_run_state,
)
from nemo_rl_clone.data.dataloader import StatefulPromptLoader
from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer
from nemo_rl_clone.utils.checkpoint import CheckpointingConfig, CheckpointManager
from nemo_rl_clone.utils.errors import UserInputError
from tests.functional.supervised_runs import small_llama


def test_a_checkpoint_without_validation_does_not_rank_by_an_older_validation(tmp_path):
    manager = CheckpointManager(
        CheckpointingConfig(checkpoint_dir=str(tmp_path), metric_name="val:accuracy", keep_top_k=1)
    )
    state = RunState()
    for step in (1, 2):
        assert state.begin_step() == step
        state.step = step
        if step == 1:  # validation on step 1 only
            state.val_metrics = {"accuracy": 0.5}
        manager.finalize_checkpoint(manager.init_tmp_checkpoint(step, state.training_info()))
    assert manager.load_training_info(tmp_path / "step_2")["val"] == {}
    # step 1 is the best validated checkpoint; step 2 stays as the latest. Had step 2 kept step 1's accuracy, it would
    # have won the tie (latest first) and step 1 would have been pruned.
    assert [step for step, _ in manager.list_checkpoints()] == [1, 2]
    assert manager.get_best_checkpoint_path() == tmp_path / "step_1"


def save_with_model(manager: CheckpointManager, model: dict) -> None:
    state = RunState(step=1, model=model)
    manager.finalize_checkpoint(manager.init_tmp_checkpoint(1, state.training_info()))


def test_resume_refuses_a_checkpoint_of_another_model_in_one_line(tmp_path):
    tokenizer = load_tokenizer(TINY_LLAMA)
    tiny = model_identity(TINY_LLAMA, tokenizer)
    small_dir = small_llama(tmp_path / "small-llama")
    small = model_identity(str(small_dir), tokenizer)
    assert tiny["architecture"] == small["architecture"] == "LlamaForCausalLM"
    assert (tiny["hidden_size"], tiny["num_hidden_layers"]) == (128, 2)
    assert (small["hidden_size"], small["num_hidden_layers"]) == (64, 1)

    ckpt = tmp_path / "ckpt"
    manager = CheckpointManager(CheckpointingConfig(checkpoint_dir=str(ckpt)))
    check_checkpoint_model(manager, small)  # an empty checkpoint_dir: nothing to compare
    save_with_model(manager, tiny)
    check_checkpoint_model(manager, tiny)  # the same model resumes
    check_checkpoint_model(manager, {**tiny, "name": "an/alias"})  # a different name of the same model too

    with pytest.raises(UserInputError) as refused:
        check_checkpoint_model(manager, small)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"checkpointing.checkpoint_dir {ckpt} holds a checkpoint of {TINY_LLAMA} (")
    assert "hidden_size 128, num_hidden_layers 2" in message and f"policy.model_name is {small_dir} (" in message
    assert "hidden_size 64, num_hidden_layers 1" in message and message.endswith(
        "use another checkpoint_dir or delete it"
    )

    # Another tokenizer (a different vocabulary) is another model too.
    with pytest.raises(UserInputError):
        check_checkpoint_model(manager, {**tiny, "tokenizer_vocab_size": tiny["tokenizer_vocab_size"] + 1})


def test_resume_refuses_a_checkpoint_of_the_other_backend(tmp_path):
    tokenizer = load_tokenizer(TINY_LLAMA)
    dtensor = model_identity(TINY_LLAMA, tokenizer)
    megatron = model_identity(TINY_LLAMA, tokenizer, "megatron")
    ckpt = tmp_path / "ckpt"
    manager = CheckpointManager(CheckpointingConfig(checkpoint_dir=str(ckpt)))
    save_with_model(manager, dtensor)
    with pytest.raises(UserInputError) as refused:
        check_checkpoint_model(manager, megatron)
    assert str(refused.value).startswith(
        f"checkpointing.checkpoint_dir {ckpt} holds a checkpoint of the dtensor policy backend, but this run uses the "
        "megatron backend (their checkpoint formats differ)"
    )
    # A checkpoint from before the backend was recorded is a DTensor one.
    legacy = {key: value for key, value in dtensor.items() if key != "backend"}
    manager = CheckpointManager(CheckpointingConfig(checkpoint_dir=str(tmp_path / "legacy")))
    save_with_model(manager, legacy)
    check_checkpoint_model(manager, dtensor)
    with pytest.raises(UserInputError):
        check_checkpoint_model(manager, megatron)


def test_checkpoints_without_a_recorded_model_resume_unchecked(tmp_path):
    manager = CheckpointManager(CheckpointingConfig(checkpoint_dir=str(tmp_path)))
    manager.finalize_checkpoint(manager.init_tmp_checkpoint(1, {"step": 1}))  # written before models were recorded
    check_checkpoint_model(manager, {"name": "x", "architecture": "Other", "hidden_size": 1})


def test_resume_refuses_a_checkpoint_of_another_seed_in_one_line(tmp_path):
    """The seed orders the data and seeds the sampling: a run of seed 7 must not continue one of seed 42."""
    ckpt = tmp_path / "ckpt"
    manager = CheckpointManager(CheckpointingConfig(checkpoint_dir=str(ckpt)))
    save_with_model(manager, {})
    saved = StatefulPromptLoader(list(range(8)), 2, list, seed=42)
    torch.save({"dataloader": saved.state_dict()}, ckpt / "step_1" / DATALOADER_FILE)
    with pytest.raises(UserInputError) as refused:
        restore_run_state(manager, StatefulPromptLoader(list(range(8)), 2, list, seed=7), {})
    assert str(refused.value) == (
        f"checkpointing.checkpoint_dir {ckpt} holds a run with seed 42, but this run's seed is 7: resume with seed 42, "
        "or use another checkpoint_dir"
    )
