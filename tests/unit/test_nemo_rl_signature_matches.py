"""Behaviour behind parameters matched to NeMo-RL v0.7.0's signatures (issue 53): each NeMo-RL parameter added here
does what NeMo-RL's does, or is refused in one line."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

from nemo_rl_clone.algorithms.advantage_estimator import ReinforcePlusPlusAdvantageEstimator
from nemo_rl_clone.algorithms.utils import calculate_baseline_and_std_per_prompt
from nemo_rl_clone.environments.dapo_math_verifier import compute_score
from nemo_rl_clone.utils.logger import Logger, LoggerConfig, MLflowConfig, WandbConfig


def test_std_rewards_give_the_std_and_rewards_the_baseline():
    prompts = torch.tensor([[1], [1], [1], [2], [2]])
    rewards = torch.tensor([1.0, 2.0, 3.0, 5.0, 7.0])
    raw = torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0])
    valid = torch.ones(5)
    baseline, std = calculate_baseline_and_std_per_prompt(prompts, rewards, valid, False, std_rewards=raw)
    plain_baseline, _ = calculate_baseline_and_std_per_prompt(prompts, rewards, valid, False)
    _, raw_std = calculate_baseline_and_std_per_prompt(prompts, raw, valid, False)
    assert torch.equal(baseline, plain_baseline)
    torch.testing.assert_close(std, raw_std)
    assert std[3:].eq(0).all() and std[0] > 0  # the second group's raw scores do not vary
    with pytest.raises(ValueError, match="std_rewards"):
        calculate_baseline_and_std_per_prompt(prompts, rewards, valid, std_rewards=raw[:3])


def test_reinforce_plus_plus_takes_nemo_rl_logprob_arguments():
    estimator = ReinforcePlusPlusAdvantageEstimator({"minus_baseline": True}, None)
    prompt_ids, rewards, mask = torch.tensor([0, 0, 1, 1]), torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.ones(4, 3)
    logprobs = torch.zeros(4, 3)
    with_logprobs = estimator.compute_advantage(prompt_ids, rewards, mask, logprobs, logprobs - 1.0)
    assert torch.equal(with_logprobs, estimator.compute_advantage(prompt_ids, rewards, mask))


def test_dapo_strict_box_verify_compares_the_last_box_as_written():
    assert compute_score("so \\boxed{42}", "42", strict_box_verify=True) == {"score": 1.0, "acc": True, "pred": "42"}
    assert compute_score("so \\boxed{42.0}", "42", strict_box_verify=True)["pred"] == "42.0"  # not normalised
    assert compute_score("Answer: 42", "42", strict_box_verify=True)["pred"] is None  # only a box counts
    far = "\\boxed{42}" + " filler" * 30
    assert compute_score(far, "42", strict_box_verify=True)["score"] == -1.0  # outside the last 100 characters
    assert compute_score(far, "42", strict_box_verify=True, pause_tokens_index=[0, 1, 2, 50])["score"] == 1.0
    with pytest.raises(ValueError, match="pause_tokens_index"):
        compute_score(far, "42", strict_box_verify=True, pause_tokens_index=[50])
    assert compute_score(solution_str="Answer: 7", ground_truth="7") == {"score": 1.0, "acc": True, "pred": "7"}


def test_wandb_entity_reaches_wandb_init(tmp_path, monkeypatch):
    calls = []

    class Run:
        def finish(self, exit_code):
            pass

    def init(**kwargs):
        calls.append(kwargs)
        return Run()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    cfg = LoggerConfig(monitor_gpus=False, wandb_enabled=True, wandb=WandbConfig(entity="my-team"))
    Logger(cfg, tmp_path, quiet=True).finish()
    assert calls[0]["entity"] == "my-team"


def test_mlflow_run_id_logs_into_that_run_and_artifact_location_is_the_experiments(tmp_path):
    from mlflow.tracking import MlflowClient

    artifacts = (tmp_path / "artifacts").as_uri()
    first = MLflowConfig(experiment_name="resume", run_name="exp_1", artifact_location=artifacts)
    logger = Logger(LoggerConfig(monitor_gpus=False, mlflow_enabled=True, mlflow=first), tmp_path, quiet=True)
    logger.log_metrics({"loss": 0.5}, 1)
    logger.finish()
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("resume")
    assert experiment.artifact_location == artifacts
    (run,) = client.search_runs([experiment.experiment_id])

    again = MLflowConfig(experiment_name="resume", run_id=run.info.run_id)
    logger = Logger(LoggerConfig(monitor_gpus=False, mlflow_enabled=True, mlflow=again), tmp_path, quiet=True)
    logger.log_metrics({"loss": 0.25}, 2)
    logger.finish()
    assert len(client.search_runs([experiment.experiment_id])) == 1
    history = client.get_metric_history(run.info.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.5), (2, 0.25)]


def test_renamed_parameters_take_nemo_rl_keywords(tmp_path):
    from nemo_rl_clone.environments.dapo_math_verifier import normalize_final_answer
    from nemo_rl_clone.utils.logger import get_next_experiment_dir

    assert normalize_final_answer(final_answer="\\frac12") == "\\frac{1}{2}"
    assert get_next_experiment_dir(base_log_dir=str(tmp_path)) == Path(tmp_path) / "exp_1"


def test_nemo_rl_env_keys_not_built_are_accepted_off_and_refused_on():
    from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
    from nemo_rl_clone.utils.config import load_validated_config
    from nemo_rl_clone.utils.config_validation import ConfigError

    smoke = Path(__file__).resolve().parents[2] / "configs" / "grpo_smoke.yaml"
    assert load_validated_config(smoke, ["++env.math.stop_strings=null"], GRPOMasterConfig)
    assert load_validated_config(smoke, ["++env.code.terminate_on_evaluation=true"], GRPOMasterConfig)
    for override, feature in (
        ("++env.math.stop_strings=[x]", "stop strings set by the math environment"),
        ("++env.code.terminate_on_evaluation=false", "multi-turn code execution"),
    ):
        with pytest.raises(ConfigError) as err:
            load_validated_config(smoke, [override], GRPOMasterConfig)
        assert [line.split(": not supported yet: ")[1].startswith(feature) for line in err.value.problems] == [True]


def test_checkpoint_manager_takes_nemo_rl_keywords_and_the_integration_keys_are_refused_on(tmp_path):
    from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
    from nemo_rl_clone.utils.checkpoint import CheckpointManager
    from nemo_rl_clone.utils.config import load_validated_config
    from nemo_rl_clone.utils.config_validation import ConfigError

    section = {"enabled": True, "checkpoint_dir": str(tmp_path), "metric_name": None, "save_period": 1}
    manager = CheckpointManager(config=section)
    tmp = manager.init_tmp_checkpoint(1, {"loss": 0.5})
    assert manager.finalize_checkpoint(checkpoint_path=str(tmp)) == tmp_path / "step_1"

    smoke = Path(__file__).resolve().parents[2] / "configs" / "grpo_smoke.yaml"
    off = ["++checkpointing.model_cache_dir=''", "++checkpointing.is_peft=false", "++checkpointing.is_async=false"]
    assert load_validated_config(smoke, off, GRPOMasterConfig)
    with pytest.raises(ConfigError, match=r"checkpointing\.is_async: not supported yet: asynchronous checkpoint"):
        load_validated_config(smoke, ["++checkpointing.is_async=true"], GRPOMasterConfig)


def test_training_sampling_params_is_built_in_nemo_rl_field_order():
    from nemo_rl_clone.algorithms.logits_sampling_utils import TrainingSamplingParams

    params = TrainingSamplingParams(50, 0.9, 0.7)
    assert (params.top_k, params.top_p, params.temperature) == (50, 0.9, 0.7)


def test_fused_linear_ce_flag_is_taken_and_draft_vocab_maps_are_refused_in_one_line():
    from nemo_rl_clone.algorithms.loss.loss_functions import DPOLossFn, NLLLossFn
    from nemo_rl_clone.algorithms.loss.utils import prepare_loss_input
    from nemo_rl_clone.contract.loss import TokenLogprobs
    from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
    from nemo_rl_clone.utils.errors import UserInputError

    # The flag names NeMo-RL's fused head; the losses here read the token logprobs a worker hands them either way.
    batch = BatchedDataDict(
        input_ids=torch.zeros(2, 4, dtype=torch.long),
        token_mask=torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1]]),
        sample_mask=torch.ones(2),
    )
    logprobs = TokenLogprobs(-torch.rand(2, 3))
    losses = [NLLLossFn(flag)(logprobs, batch, torch.tensor(2.0), torch.tensor(5.0))[0] for flag in (False, True)]
    assert losses[0] == losses[1] == -(logprobs.values * batch["token_mask"][:, 1:]).sum() / 5
    assert DPOLossFn({}, use_linear_ce_fusion=True).use_linear_ce_fusion
    data = BatchedDataDict(input_ids=torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(UserInputError, match="d2t: not supported yet"):
        prepare_loss_input(torch.zeros(1, 3, 5), data, NLLLossFn(), d2t=torch.arange(5))


def test_formatted_message_log_renders_tools_and_prints_when_debugging(capsys):
    from nemo_rl_clone.data.llm_message_utils import get_formatted_message_log
    from nemo_rl_clone.models.huggingface import load_tokenizer

    tokenizer = load_tokenizer("tiny-random-llama")
    tokenizer.chat_template = (
        "{% if tools %}tools: {{ tools | map(attribute='name') | join(',') }}\n{% endif %}"
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    )
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    log = get_formatted_message_log(messages, tokenizer, None, False, False, False, [{"name": "search"}], True)
    assert [m["content"] for m in log] == ["tools: search\nuser: hi\n", "assistant: yo\n"]
    assert capsys.readouterr().out == "[0] user: 'tools: search\\nuser: hi\\n'\n[1] assistant: 'assistant: yo\\n'\n"


def test_init_collective_takes_nemo_rl_arguments_and_refuses_several_train_ranks():
    from nemo_rl_clone.models.generation.vllm.vllm_generation import VllmGeneration
    from nemo_rl_clone.models.policy.lm_policy import Policy
    from nemo_rl_clone.utils.errors import UserInputError

    for owner in (Policy, VllmGeneration):
        with pytest.raises(UserInputError, match="train_world_size=8: not supported yet"):
            owner.init_collective(object(), ip="10.0.0.1", port=29500, world_size=9, train_world_size=8)


def test_policy_times_its_phases_under_nemo_rl_labels_with_a_timer():
    from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
    from nemo_rl_clone.models.policy.lm_policy import Policy
    from nemo_rl_clone.utils.errors import UserInputError
    from nemo_rl_clone.utils.timer import Timer

    policy = object.__new__(Policy)  # no workers: the sharding and the workers' call are stubbed
    policy.is_reward_model, policy.dp_size = False, 1
    policy._shard = lambda data, phase, **kwargs: ([data], None)
    policy._run_sharded = lambda method, shards, kwargs: [BatchedDataDict(logprobs=torch.zeros(1, 2))]
    data = BatchedDataDict(input_ids=torch.zeros(1, 2, dtype=torch.long), input_lengths=torch.tensor([2]))
    timer = Timer()
    policy.get_logprobs(data, timer)
    policy.get_reference_policy_logprobs(data, timer=timer)
    assert set(timer.get_timing_metrics()) == {
        "get_logprobs/shard_data",
        "get_logprobs/submit_logprob_futures",
        "get_reference_policy_logprobs/shard_data",
        "get_reference_policy_logprobs/submit_reference_policy_logprob_futures",
    }
    with pytest.raises(UserInputError, match="check_dim_skip_keys: not supported yet"):
        policy.train(data, None, check_dim_skip_keys=["teacher_logits"])


def test_policy_refuses_nemo_rl_options_not_built_and_resolves_checkpointing_cfg(tmp_path):
    from nemo_rl_clone.models.policy.lm_policy import Policy
    from nemo_rl_clone.models.policy.nemo_rl_options import consolidated_folder
    from nemo_rl_clone.utils.errors import UserInputError

    with pytest.raises(UserInputError) as err:  # before the cluster or the config is touched
        Policy(None, {}, None, processor=object(), worker_extension_cls_fqn="pkg.Ext")  # type: ignore[arg-type]
    assert err.value.problems == [
        "Policy: processor: not supported yet: vision and audio inputs (a multimodal processor)",
        "Policy: worker_extension_cls_fqn: not supported yet: worker extension classes",
    ]
    weights = str(tmp_path / "step_1" / "policy" / "weights")
    section = {"checkpoint_dir": str(tmp_path), "save_consolidated": True, "model_save_format": "torch_save"}
    assert consolidated_folder(weights, section, None, "safetensors") == (
        str(tmp_path / "step_1" / "policy" / "hf"),
        "torch_save",
    )
    assert consolidated_folder(weights, {**section, "save_consolidated": False}, None, "safetensors") == (
        None,
        "safetensors",
    )
    assert consolidated_folder(weights, None, "/x/hf", "safetensors") == ("/x/hf", "safetensors")


def test_kv_scales_are_refused_by_name():
    from nemo_rl_clone.models.policy.lm_policy import Policy
    from nemo_rl_clone.utils.errors import UserInputError

    with pytest.raises(UserInputError, match="kv_scales: not supported yet"):
        Policy.broadcast_weights_for_collective(object(), {"layer.0.k_scale": 1.0})  # type: ignore[arg-type]
