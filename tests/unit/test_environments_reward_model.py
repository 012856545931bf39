"""Reward-model environment: which model it loads, what text it scores, and its scores against a plain Hugging Face
forward of the same model (tiny random Llama with a score head; fp32, tolerance 1e-5)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
import yaml

from nemo_rl_clone.data.llm_message_utils import get_formatted_message_log, message_from_token_ids
from nemo_rl_clone.environments.config import RewardModelEnvConfig
from nemo_rl_clone.environments.reward_model_environment import (
    RewardModelEnvironment,
    RewardModelError,
    resolve_reward_model,
)
from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer, resolve_model_path
from nemo_rl_clone.models.policy.workers.reward_model import load_reward_model
from nemo_rl_clone.utils.config_validation import ConfigError, validate_config

ATOL = 1e-5  # fp32 scorer vs fp32 HF forward of the same tokens


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer(TINY_LLAMA)


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Path:
    """A sequence-classification folder: the tiny Llama with a score head, perturbed so scores differ by text."""
    model = load_reward_model(resolve_model_path(TINY_LLAMA), tokenizer.pad_token_id)
    with torch.no_grad():
        model.score.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(3))
    folder = tmp_path_factory.mktemp("rm") / "hf"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def hf_score(folder: Path, tokenizer: Any, text: str) -> float:
    """The reference: the model's score head at the last token of the text, one unpadded row."""
    model = load_reward_model(str(folder), tokenizer.pad_token_id).eval()
    ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state
        return float(model.score(hidden)[0, -1, 0])


def conversation(tokenizer: Any, question: str, answer: str, ended_with_eos: bool) -> list[dict[str, Any]]:
    """A rollout's message log: the templated prompt, then generated tokens (with the eos when generation ended so)."""
    prompt = get_formatted_message_log(
        [{"role": "user", "content": question}],
        tokenizer,
        add_bos_token=False,
        add_eos_token=False,
        add_generation_prompt=True,
    )
    ids = tokenizer.encode(answer, add_special_tokens=False) + ([tokenizer.eos_token_id] if ended_with_eos else [])
    return [*prompt, message_from_token_ids("assistant", ids, tokenizer)]


def test_scores_the_templated_conversation_as_a_whole_rendering(reward_model_dir: Path, tokenizer: Any) -> None:
    env = RewardModelEnvironment(RewardModelEnvConfig(model_name=str(reward_model_dir), batch_size=2))
    pairs = [("What is 2+2?", "4", True), ("Name a colour.", "Blue, I think", False), ("Hi", "Hello there!", True)]
    logs = [conversation(tokenizer, q, a, eos) for q, a, eos in pairs]
    # The scored text is what the chat template renders for the whole conversation, however generation stopped.
    for (question, answer, _), log in zip(pairs, logs, strict=True):
        whole = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}, {"role": "assistant", "content": answer}], tokenize=False
        )
        assert env.conversation_text(log) == whole
    result = env.step(logs, [{} for _ in logs])
    expected = torch.tensor([hf_score(reward_model_dir, tokenizer, env.conversation_text(log)) for log in logs])
    torch.testing.assert_close(result.rewards, expected, atol=ATOL, rtol=0)
    assert len(set(result.rewards.tolist())) == 3  # the perturbed head tells the texts apart
    assert result.terminateds.all() and result.next_stop_strings == [None] * 3
    # Batching pads rows; a batch of one row scores the same.
    one_by_one = RewardModelEnvironment(RewardModelEnvConfig(model_name=str(reward_model_dir), batch_size=1))
    torch.testing.assert_close(one_by_one.step(logs, [{} for _ in logs]).rewards, result.rewards, atol=ATOL, rtol=0)
    _, metrics = env.global_post_process_and_metrics({"rewards": result.rewards})
    assert metrics["num_scored"] == 3 and metrics["truncated"] == 0
    assert metrics["mean_reward"] == pytest.approx(float(result.rewards.mean()))
    assert env.global_post_process_and_metrics({"rewards": result.rewards})[1]["num_scored"] == 0  # reset per call


def test_long_conversations_keep_their_last_tokens(reward_model_dir: Path, tokenizer: Any) -> None:
    env = RewardModelEnvironment(RewardModelEnvConfig(model_name=str(reward_model_dir), max_model_len=8))
    log = conversation(tokenizer, "Tell me a long story about a dragon and a knight.", "Once upon a time", True)
    text = env.conversation_text(log)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > 8
    score = float(env.step([log], [{}]).rewards[0])
    assert score == pytest.approx(hf_score(reward_model_dir, tokenizer, tokenizer.decode(ids[-8:])), abs=1e-4)
    assert env.global_post_process_and_metrics({"rewards": torch.tensor([score])})[1]["truncated"] == 1
    # NeMo-RL's preprocess_data: the same rows, right-padded, as input_ids and input_lengths
    short = conversation(tokenizer, "Hi", "Yo", True)
    data = env.preprocess_data([log, short])
    short_ids = tokenizer.encode(env.conversation_text(short), add_special_tokens=False)[-8:]
    assert data["input_lengths"].tolist() == [8, len(short_ids)]
    assert data["input_ids"][0].tolist() == ids[-8:]
    assert data["input_ids"][1].tolist() == short_ids + [tokenizer.pad_token_id] * (8 - len(short_ids))
    assert env.global_post_process_and_metrics({"rewards": torch.tensor([score])})[1]["num_scored"] == 0


def write_checkpoint(
    root: Path, state_dict: dict[str, torch.Tensor], reward_model: bool = True, megatron: bool = False
) -> Path:
    """A checkpoint in run_rm.py's layout: step_N/{training_info.json, config.yaml, policy/weights (DCP)}."""
    step_dir = root / "step_4"
    (step_dir / "policy").mkdir(parents=True)
    dcp.save({"model": state_dict}, checkpoint_id=step_dir / "policy" / "weights", no_dist=True)
    policy = {"model_name": TINY_LLAMA, "reward_model_cfg": {"enabled": reward_model}}
    if megatron:  # (its weights would be a Megatron distributed checkpoint)
        policy["megatron_cfg"] = {"enabled": True}
    (step_dir / "config.yaml").write_text(yaml.safe_dump({"policy": policy}))
    (step_dir / "training_info.json").write_text(json.dumps({"step": 4}))
    return step_dir


def test_a_run_rm_checkpoint_loads_its_trained_weights(reward_model_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    trained = load_reward_model(str(reward_model_dir), tokenizer.pad_token_id).state_dict()
    write_checkpoint(tmp_path / "results", {k: v.clone() for k, v in trained.items()})
    for path in ("results", "results/step_4", "results/step_4/policy/weights"):
        cfg = RewardModelEnvConfig(model_name=None, checkpoint_path=str(tmp_path / path))
        source = resolve_reward_model(cfg)
        assert source.weights_dir == tmp_path / "results/step_4/policy/weights", path
    env = RewardModelEnvironment(RewardModelEnvConfig(model_name=TINY_LLAMA, checkpoint_path=str(tmp_path / "results")))
    log = conversation(tokenizer, "What is 2+2?", "4", True)
    expected = hf_score(reward_model_dir, tokenizer, env.conversation_text(log))
    assert float(env.step([log], [{}]).rewards[0]) == pytest.approx(expected, abs=ATOL)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda tmp, rm: RewardModelEnvConfig(model_name=TINY_LLAMA), "has no trained score head"),
        (lambda tmp, rm: RewardModelEnvConfig(checkpoint_path=str(tmp / "none")), "is not a checkpoint"),
        (lambda tmp, rm: RewardModelEnvConfig(model_name=str(tmp / "missing")), "does not exist"),
        (
            lambda tmp, rm: RewardModelEnvConfig(checkpoint_path=str(write_checkpoint(tmp, rm, reward_model=False))),
            "is a policy \\(causal LM\\) checkpoint, not a reward model",
        ),
        (
            lambda tmp, rm: RewardModelEnvConfig(checkpoint_path=str(write_checkpoint(tmp, rm, megatron=True))),
            "was trained on the megatron backend and holds no consolidated Hugging Face export",
        ),
        (
            lambda tmp, rm: RewardModelEnvConfig(
                model_name="other-model", checkpoint_path=str(write_checkpoint(tmp, rm))
            ),
            "'other-model', but the checkpoint .* was trained from 'tiny-random-llama'",
        ),
    ],
)
def test_unusable_models_fail_with_one_line(
    reward_model_dir: Path, tokenizer: Any, tmp_path: Path, make: Any, match: str
) -> None:
    state = {"w": torch.zeros(1)}
    with pytest.raises(RewardModelError, match=match) as error:
        resolve_reward_model(make(tmp_path, state))
    assert "\n" not in str(error.value) and str(error.value).startswith("env.reward_model.")


def test_a_gpu_the_cluster_lacks_is_refused_in_the_driver(ray_local: None, reward_model_dir: Path) -> None:
    cfg = RewardModelEnvConfig(model_name=str(reward_model_dir))
    assert RewardModelEnvironment.actor_options(cfg) == {}
    cfg.resources.gpus_per_node = 1
    with pytest.raises(RewardModelError, match="gpus_per_node: 1 GPU asked for, the Ray cluster has 0; set it to 0"):
        RewardModelEnvironment.actor_options(cfg)


NEMO_RL_SECTION = {  # the shape of NeMo-RL's reward-model recipe section (GPU values), all accepted
    "enabled": True,
    "model_name": "Skywork/Skywork-Reward-V2-Qwen3-0.6B",
    "tokenizer": {"name": "Skywork/Skywork-Reward-V2-Qwen3-0.6B"},
    "precision": "bfloat16",
    "batch_size": 4,
    "checkpoint_path": None,
    "max_model_len": 2048,
    "processor": "math_hf_data_processor",
    "resources": {"gpus_per_node": 1, "num_nodes": 1},
    "reward_model_cfg": {"enabled": True, "reward_model_type": "bradley_terry"},
    "dtensor_cfg": {
        "_v2": True,
        "enabled": True,
        "cpu_offload": False,
        "sequence_parallel": False,
        "activation_checkpointing": False,
        "tensor_parallel_size": 1,
        "context_parallel_size": 1,
        "custom_parallel_plan": None,
    },
    "dynamic_batching": {"enabled": False},
    "sequence_packing": {"enabled": False},
    "max_grad_norm": None,
    "offload_optimizer_for_logprob": False,
}


@pytest.mark.parametrize(
    ("key", "value", "line"),
    [
        (None, None, None),
        ("dtensor_cfg.tensor_parallel_size", 2, "dtensor_cfg.tensor_parallel_size: the reward-model environment runs"),
        ("resources.num_nodes", 2, "resources.num_nodes: the reward-model environment runs its model in one process"),
        ("sequence_packing.enabled", True, "sequence_packing.enabled: not supported by the reward-model environment"),
        ("max_grad_norm", 1.0, "max_grad_norm: the reward model is not trained here; set it to null"),
        ("reward_model_cfg.reward_model_type", "pairwise", "must be one of ['bradley_terry'], got 'pairwise'"),
        ("precision", "int8", "precision: must be one of ['float32', 'bfloat16'], got 'int8'"),
    ],
)
def test_nemo_rl_section_validates_and_refusals_name_the_key(key: str | None, value: Any, line: str | None) -> None:
    section = json.loads(json.dumps(NEMO_RL_SECTION))
    if key is None:
        cfg = validate_config(section, RewardModelEnvConfig)
        assert cfg.resources.gpus_per_node == 1 and cfg.precision == "bfloat16"
        return
    node = section
    *parents, leaf = key.split(".")
    for part in parents:
        node = node[part]
    node[leaf] = value
    with pytest.raises(ConfigError) as error:
        validate_config(section, RewardModelEnvConfig)
    assert len(error.value.problems) == 1 and line in error.value.problems[0], error.value.problems
