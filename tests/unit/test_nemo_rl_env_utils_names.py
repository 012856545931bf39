"""NeMo-RL v0.7.0's environment, generation-config, checkpoint and utils names at their paths (issue 53): each
behaves as NeMo-RL's on a tiny input, expected values worked out by hand from NeMo-RL's rules."""

from __future__ import annotations

import pytest
import torch

from nemo_rl_clone.utils.unsupported_modules import UnsupportedFeatureError


def test_rewards_read_the_tagged_answer() -> None:
    from nemo_rl_clone.environments import rewards

    assert rewards.format_reward("x", "<think>hm</think> <answer>4</answer>") == (1.0, None)
    assert rewards.format_reward("x", "<answer>4</answer>") == (0.75, None)
    assert rewards.format_reward("x", "<think>hm</think>", think_tag="think", answer_tag="ans") == (0.25, None)
    assert rewards.exact_answer_alphanumeric_reward("Paris", "<answer> paris. </answer>") == (1.0, True)
    assert rewards.exact_answer_alphanumeric_reward("Paris", "paris") == (0.0, False)  # no tags: no answer
    # greedy: from the first <answer> to the last </answer>
    assert rewards.exact_answer_alphanumeric_reward("12", "<answer>1</answer><answer>2</answer>") == (0.0, False)
    assert rewards.math_expression_reward("\\frac{1}{2}", "<answer>0.5</answer>") == (1.0, True)
    assert rewards.math_expression_reward("3", "<sol>3</sol>", tag="sol") == (1.0, True)
    assert rewards.math_expression_reward("3", "<answer>4</answer>") == (0.0, False)


def test_combined_rewards_are_a_renormalised_weighted_mean() -> None:
    from nemo_rl_clone.environments import rewards

    combined = rewards.combine_reward_functions(
        [(rewards.format_reward, 1.0), (rewards.exact_answer_alphanumeric_reward, 3.0)]
    )
    # format 0.75 (no think block) weighs 1/4, the exact answer 1.0 weighs 3/4; format's None is not a verdict
    assert combined("b", "<answer>B</answer>") == (pytest.approx(0.75 * 0.25 + 0.75), True)
    assert combined("c", "<think>.</think><answer>B</answer>") == (pytest.approx(0.25), False)


def test_image_rewards_are_refused_by_name() -> None:
    from nemo_rl_clone.environments import rewards

    with pytest.raises(UnsupportedFeatureError, match="bbox_giou_reward: not supported yet: vision"):
        rewards.bbox_giou_reward  # noqa: B018


def test_dapo_verifier_pieces() -> None:
    from nemo_rl_clone.environments import dapo_math_verifier as dapo

    assert dapo.last_boxed_only_string("\\boxed{1} then \\boxed{\\frac{a}{b}} end") == "\\boxed{\\frac{a}{b}}"
    assert dapo.last_boxed_only_string("\\boxed{1} \\boxed{2") is None  # the last box is never closed
    assert dapo.last_boxed_only_string("no box") is None
    assert dapo.remove_boxed("\\boxed{x+1}") == "x+1"
    with pytest.raises(ValueError, match="remove_boxed"):
        dapo.remove_boxed("x+1")
    assert ("mbox", "text") in dapo.SUBSTITUTIONS and "ft" not in dapo.REMOVED_EXPRESSIONS
    assert dapo.normalize_final_answer("5 ft") == "5ft"  # NeMo-RL's list keeps "ft" (Minerva's drops it)
    assert dapo.is_correct_minerva("so\nAnswer: 1,000 dollars", "1000") == (True, "1000")
    assert dapo.is_correct_minerva("no answer line", "7") == (False, "[INVALID]")
    assert dapo.is_correct_minerva("Answer: 7", "the sum is \\boxed{7}", gt_need_extract=True) == (True, "7")
    assert dapo.is_correct_minerva("Result= 9", "9", answer_pattern=r"Result\s*=\s*(\S+)") == (True, "9")
    assert dapo.is_correct_strict_box("thus \\boxed{42}", "42") == (1, "42")
    assert dapo.is_correct_strict_box("thus \\boxed{42.0}", "42") == (-1, "42.0")  # as written, not normalised
    assert dapo.is_correct_strict_box("no box", "42") == (-1, None)
    assert dapo.verify("Answer: \\frac12", "\\frac{1}{2}") == (True, "\\frac{1}{2}")
    assert dapo.verify("Answer: 3 \\boxed{4}", "4", strict_box_verify=True) == (True, "4")


def test_pass_rate_counts_distinct_prompts_with_a_correct_response() -> None:
    from nemo_rl_clone.environments.metrics import calculate_pass_rate_per_prompt

    prompts = torch.tensor([[1, 2], [1, 2], [3, 4], [5, 6]])
    assert calculate_pass_rate_per_prompt(prompts, torch.tensor([0.0, 1.0, 0.0, 0.0])) == pytest.approx(1 / 3)
    assert calculate_pass_rate_per_prompt(prompts, torch.tensor([True, False, False, True])) == pytest.approx(2 / 3)
    assert calculate_pass_rate_per_prompt(prompts, torch.tensor([-1.0, -1.0, 0.0, 0.0])) == 0.0  # > 0 counts


def test_environment_utils() -> None:
    from nemo_rl_clone.environments.utils import EnvRegistryEntry, chunk_list_to_workers

    assert chunk_list_to_workers([1, 2, 3, 4, 5], 3) == [[1, 2], [3, 4], [5]]
    assert chunk_list_to_workers([1, 2, 3, 4], 3) == [[1, 2], [3, 4]]  # ceil(4/3) = 2 per chunk: two chunks
    assert chunk_list_to_workers([1, 2], 4) == [[1], [2], [], []]
    assert chunk_list_to_workers([], 2) == [[], []]
    entry: EnvRegistryEntry = {"actor_class_fqn": "pkg.mod.Cls"}
    assert EnvRegistryEntry.__optional_keys__ >= {"actor_class_fqn", "default_processor"} and entry


def test_answer_parsing() -> None:
    import re

    from nemo_rl_clone.evals import answer_parsing as ap

    pattern = ap.MULTILINGUAL_ANSWER_PATTERN_TEMPLATE.format(ap.MULTILINGUAL_ANSWER_REGEXES[0])
    assert re.search(pattern, "so... answer:  c").group(1) == "c"  # case-insensitive
    assert any(
        re.search(ap.MULTILINGUAL_ANSWER_PATTERN_TEMPLATE.format(r), "Antwort: B")
        for r in ap.MULTILINGUAL_ANSWER_REGEXES
    )
    assert ap.normalize_extracted_answer("ب") == "B"
    assert ap.normalize_extracted_answer(" Ｃ ") == "C"
    assert ap.normalize_response("**Answer: $\\boxed{A}$**") == "Answer: A"
    assert ap.normalize_response("\\text{B}") == "B}"  # only "}$" closings go


def test_verify_right_padding() -> None:
    from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
    from nemo_rl_clone.models.generation.interfaces import verify_right_padding

    ids = torch.tensor([[5, 6, 0], [7, 0, 0]])
    good = BatchedDataDict({"input_ids": ids, "input_lengths": torch.tensor([2, 1])})
    assert verify_right_padding(good) == (True, None)
    left_padded = BatchedDataDict({"input_ids": torch.tensor([[0, 5, 6]]), "input_lengths": torch.tensor([2])})
    ok, problem = verify_right_padding(left_padded, raise_error=False)
    assert not ok and "positions [2]" in problem
    with pytest.raises(ValueError, match="positions"):
        verify_right_padding(left_padded)
    # an output batch is read through unpadded_sequence_lengths, with the tokenizer's pad value
    out = BatchedDataDict({"output_ids": torch.tensor([[5, 9, 9]]), "unpadded_sequence_lengths": torch.tensor([1])})
    assert verify_right_padding(out, pad_value=9) == (True, None)
    assert verify_right_padding(out, pad_value=0, raise_error=False)[0] is False
    too_long = BatchedDataDict({"input_ids": ids, "input_lengths": torch.tensor([4, 1])})
    assert "exceeds" in verify_right_padding(too_long, raise_error=False)[1]
    assert verify_right_padding(BatchedDataDict({"x": ids}), raise_error=False)[0] is False


def test_generation_config_names() -> None:
    from typing import get_type_hints

    from transformers import PreTrainedTokenizerBase

    from nemo_rl_clone.models import generation
    from nemo_rl_clone.models.generation import constants, interfaces
    from nemo_rl_clone.models.generation.vllm.config import VllmConfig, VllmSpecificArgs

    assert (constants.VLLM_BACKEND, constants.SGLANG_BACKEND, constants.MEGATRON_BACKEND) == (
        "vllm",
        "sglang",
        "megatron",
    )
    assert generation.TokenizerType is PreTrainedTokenizerBase
    assert {
        "backend",
        "max_new_tokens",
        "stop_token_ids",
        "colocated",
    } <= interfaces.GenerationConfig.__required_keys__ | interfaces.GenerationConfig.__optional_keys__
    assert "model_name" in interfaces.GenerationConfig.__optional_keys__  # GRPO writes it
    assert interfaces.GenerationConfig.__required_keys__ >= {"backend", "top_k", "stop_strings"}
    assert get_type_hints(interfaces.ColocationConfig)["resources"] is interfaces.OptionalResourcesConfig
    assert {"input_ids", "input_lengths"} <= interfaces.GenerationDatumSpec.__required_keys__
    assert "truncated" in interfaces.GenerationOutputSpec.__optional_keys__
    assert {"max_model_len", "load_format", "skip_tokenizer_init"} <= VllmSpecificArgs.__optional_keys__
    section: VllmConfig = {"backend": "vllm", "vllm_cfg": VllmSpecificArgs(max_model_len=64)}
    assert section["vllm_cfg"] == {"max_model_len": 64}


def test_policy_config_names() -> None:
    from nemo_rl_clone.models import policy

    assert policy.DTensorConfig.__required_keys__ >= {"enabled", "tensor_parallel_size", "cpu_offload"}
    assert "lora_cfg" in policy.DTensorConfig.__optional_keys__
    assert policy.SequencePackingConfig.__required_keys__ == {"enabled", "train_mb_tokens", "algorithm"}
    assert policy.DynamicBatchingConfig.__required_keys__ == {"enabled", "train_mb_tokens", "sequence_length_round"}
    assert policy.RewardModelConfig.__required_keys__ == {"enabled", "reward_model_type"}
    assert policy.SchedulerMilestones == dict[str, list[int]]
    assert "draft" in policy.PolicyConfig.__optional_keys__ and "dtensor_cfg" in policy.PolicyConfig.__required_keys__
    assert policy.DraftConfigDisabled(enabled=False) == {"enabled": False}
    for refused in ("DraftConfig", "AutomodelKwargs"):
        with pytest.raises(UnsupportedFeatureError, match=f"policy.{refused}: not supported yet"):
            getattr(policy, refused)


def test_merge_with_override() -> None:
    from omegaconf import DictConfig, OmegaConf

    from nemo_rl_clone.utils.config import merge_with_override

    base = {"data": {"train": {"name": "a", "split": "train"}}, "seed": 1}
    merged = merge_with_override(base, {"data": {"train": {"name": "b"}}, "seed": 2})
    assert isinstance(merged, DictConfig)
    assert OmegaConf.to_container(merged) == {"data": {"train": {"name": "b", "split": "train"}}, "seed": 2}
    replaced = merge_with_override(OmegaConf.create(base), OmegaConf.create({"data": {"_override_": True, "x": 1}}))
    assert OmegaConf.to_container(replaced) == {"data": {"x": 1}, "seed": 1}  # replaced, marker dropped


def test_package_info_and_checkpoint_names() -> None:
    import os
    from importlib.metadata import version
    from typing import Any, get_args

    from nemo_rl_clone import package_info
    from nemo_rl_clone.utils import checkpoint

    assert package_info.VERSION == (
        package_info.MAJOR,
        package_info.MINOR,
        package_info.PATCH,
        package_info.PRE_RELEASE,
    )
    assert ".".join(map(str, package_info.VERSION[:3])) + package_info.PRE_RELEASE == version("nemo_rl_clone")
    assert isinstance(package_info.MAJOR, int)
    assert set(get_args(checkpoint.PathLike)) == {str, os.PathLike[Any]}
    with pytest.raises(UnsupportedFeatureError, match="PretrainedCheckpointConfig: not supported yet: initial weights"):
        checkpoint.PretrainedCheckpointConfig  # noqa: B018


class _Tokenizer:
    """Decodes id i as chr(ord('a') + i); id 0 is the special (pad/eos) token."""

    pad_token_id = eos_token_id = 0

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join("<s>" if i == 0 else chr(ord("a") + i) for i in ids if not (skip_special_tokens and i == 0))


class _Generation:
    def __init__(self) -> None:
        self.seen: object = None

    def generate(self, data: object, greedy: bool = False) -> object:
        from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict

        self.seen = data
        # row 0: prompt [1, 2] + answer [3, 0(eos)]; row 1: prompt [4] + answer [5], then padding
        return BatchedDataDict(
            output_ids=torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]]),
            logprobs=torch.tensor([[0.0, 0.0, -0.5, -0.1], [0.0, -0.7, 0.0, 0.0]]),
            generation_lengths=torch.tensor([2, 1]),
            unpadded_sequence_lengths=torch.tensor([4, 2]),
            truncated=torch.tensor([False, True]),
        )


def test_generate_responses_appends_each_answer_to_its_message_log() -> None:
    from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
    from nemo_rl_clone.experience.rollouts import TokenizerType, generate_responses

    assert TokenizerType.__name__ == "PreTrainedTokenizerBase"
    from nemo_rl_clone.experience import rollouts

    with pytest.raises(UnsupportedFeatureError, match="EffortLevelsConfig: not supported yet: NeMo-Gym"):
        rollouts.EffortLevelsConfig  # noqa: B018
    batch = BatchedDataDict(message_log=[[{"role": "user", "content": "x"}], [{"role": "user", "content": "y"}]])
    engine = _Generation()
    data = BatchedDataDict(input_ids=torch.tensor([[1, 2], [4, 0]]), input_lengths=torch.tensor([2, 1]))
    out, generated, metrics = generate_responses(engine, data, batch, _Tokenizer(), torch.tensor([2, 1]))
    assert out is batch and engine.seen["stop_strings"] == [None, None]
    assert [ids.tolist() for ids in generated] == [[3, 0], [5]]
    answer = batch["message_log"][0][-1]
    assert (answer["role"], answer["content"], answer["token_ids"].tolist()) == ("assistant", "d", [3, 0])
    assert answer["generation_logprobs"].tolist() == [-0.5, pytest.approx(-0.1)]
    assert batch["message_log"][1][-1]["content"] == "f"
    assert metrics["mean_generation_length"] == 1.5 and metrics["total_generated_tokens"] == 3
    assert metrics["_response_truncated"].tolist() == [False, True]
    batch["stop_strings"] = [["\n"], None]
    _, _, _ = generate_responses(engine, data, batch, _Tokenizer(), torch.tensor([2, 1]), include_logprobs=False)
    assert engine.seen["stop_strings"] == [["\n"], None] and "generation_logprobs" not in batch["message_log"][0][-1]


def test_calculate_rewards_returns_in_batch_order(monkeypatch: pytest.MonkeyPatch) -> None:
    from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
    from nemo_rl_clone.environments.interfaces import EnvironmentReturn
    from nemo_rl_clone.experience.rollouts import calculate_rewards
    from nemo_rl_clone.rollout import multi_turn

    class Env:
        def __init__(self, reward: float) -> None:
            self.reward = reward
            self.step = self  # env.step.remote(...)

        def remote(self, logs: list, infos: list) -> EnvironmentReturn:
            n = len(logs)
            return EnvironmentReturn(
                observations=[{"role": "environment", "content": str(info)} for info in infos],
                metadata=infos,
                next_stop_strings=[None] * n,
                rewards=torch.full((n,), self.reward),
                terminateds=torch.ones(n, dtype=torch.bool),
            )

    monkeypatch.setattr(multi_turn.ray, "get", lambda ref: ref)  # the fake environments answer at once
    batch = BatchedDataDict(
        message_log=[[], [], []], extra_env_info=[{"i": 0}, {"i": 1}, {"i": 2}], task_name=["a", "b", "a"]
    )
    result = calculate_rewards(batch, {"a": Env(1.0), "b": Env(0.5)})
    assert result.rewards.tolist() == [1.0, 0.5, 1.0]  # back in the batch's order, not grouped by task
    assert result.metadata == [{"i": 0}, {"i": 1}, {"i": 2}] and result.answers == [None, None, None]
    assert result.terminateds.dtype == torch.bool
    with pytest.raises(ValueError, match=r"no environment for task_name \['b'\]"):
        calculate_rewards(batch, {"a": Env(1.0)})


def test_hf_verify_worker_scores_as_the_math_environment() -> None:
    from nemo_rl_clone.environments import math_environment as math_env

    worker = math_env.HFVerifyWorker.__ray_actor_class__()  # the actor's class, run in this process
    assert worker.verify(["so \\boxed{4}", "it is 5", "\\boxed{1}"], ["4", "4", "\\frac{"]) == [1.0, 0.0, 0.0]
    rewards, answers = worker.verify(["x \\boxed{\\frac{1}{2}}"], ["0.5"], return_extracted_answer=True)
    assert rewards == [1.0] and answers == ["\\frac{1}{2}"]
    dapo = worker.verify(["Answer: 0.5"], ["\\frac{1}{2}"], math_verify_impl="dapo_math_verify")
    assert dapo == [-1.0]  # DAPO compares normalised strings, not values; a miss scores -1
    with pytest.raises(ValueError, match="math_verify_impl"):
        worker.verify(["a"], ["b"], math_verify_impl="sympy")
    assert math_env.MathEnvironmentMetadata.__required_keys__ == {"ground_truth", "extracted_answer"}
    from nemo_rl_clone.environments.math_multi_reward_environment import MathMultiRewardEnvironment

    assert math_env.MathMultiRewardEnvironment is MathMultiRewardEnvironment
    english = math_env.EnglishMultichoiceVerifyWorker.__ray_actor_class__()  # NeMo-RL's multiple-choice verifiers
    assert english.verify(["Answer: B", "B"], ["B", "B"], return_extracted_answer=True) == ([1.0, 0.0], ["B", None])


def test_reward_model_environment_config_shape() -> None:
    from nemo_rl_clone.environments.reward_model_environment import RewardModelEnvironmentConfig

    assert {"model_name", "batch_size", "resources", "dtensor_cfg"} <= RewardModelEnvironmentConfig.__required_keys__
    assert {"logprob_batch_size", "generation", "sequence_packing"} <= RewardModelEnvironmentConfig.__optional_keys__


def test_multi_turn_code_execution_names_are_refused() -> None:
    from nemo_rl_clone.environments import code_environment

    for name in ("CodeExecutionWorker", "CodeEnvMetadata"):
        with pytest.raises(UnsupportedFeatureError, match=f"{name}: not supported yet: multi-turn code execution"):
            getattr(code_environment, name)


def test_generation_interface_optional_hooks() -> None:
    from nemo_rl_clone.models.generation.vllm.vllm_generation import VllmGeneration

    generation = object.__new__(VllmGeneration)  # the hooks read no state: no engines needed
    assert generation.requires_kv_scale_sync is False
    assert generation.get_logger_metrics() == {} and generation.clear_logger_metrics() is None
    with pytest.raises(UnsupportedFeatureError, match="update_weights_via_ipc_zmq: not supported yet: CUDA-IPC"):
        generation.update_weights_via_ipc_zmq()
