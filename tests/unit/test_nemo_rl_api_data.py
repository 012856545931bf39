"""NeMo-RL-style calls into evals.eval, environments.interfaces, data.* and algorithms.utils, each checked against
a hand computation or an independent reference."""

from __future__ import annotations

import copy
import itertools
import math
import warnings
from collections import Counter
from typing import Any

import pytest
import torch
from datasets import Dataset

from nemo_rl_clone.algorithms.utils import (
    calculate_baseline_and_std_per_prompt,
    calculate_kl,
    get_tokenizer,
    mask_out_neg_inf_logprobs,
    set_seed,
    surpress_user_warnings,
)
from nemo_rl_clone.data.interfaces import (
    DatumSpec,
    FlatMessagesType,
    TaskDataProcessFn,
    TaskDataProcessFnCallable,
    TaskDataSpec,
    TokenizerType,
)
from nemo_rl_clone.data.llm_message_utils import (
    add_loss_mask_to_message_log,
    get_first_index_that_differs,
    get_formatted_message_log,
    message_log_shape,
    remap_dataset_keys,
)
from nemo_rl_clone.data.multimodal_utils import (
    PackedTensor,
    get_dim_to_pack_along,
    get_multimodal_keys_from_processor,
    resolve_to_image,
)
from nemo_rl_clone.environments.interfaces import EnvironmentInterface, EnvironmentReturn
from nemo_rl_clone.evals.eval import eval_cons_k, eval_pass_k
from nemo_rl_clone.models.huggingface import load_tokenizer

# ---------------------------------------------------------------------------------------------------------------
# evals.eval
# ---------------------------------------------------------------------------------------------------------------


def test_eval_pass_k_sums_the_unbiased_estimator_over_problems():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    # n=4 per problem, k=2: 1 - C(n-c, 2)/C(4, 2) with c = 2, 0, 4
    expected = (1 - math.comb(2, 2) / math.comb(4, 2)) + 0.0 + 1.0
    assert eval_pass_k(rewards, num_tests_per_prompt=4, k=2) == pytest.approx(expected, abs=1e-12)


def _majority_by_hand(answers, rewards):
    """Independent reference: the most common answer of a subset (ties: the earliest), correct if its reward is 1."""
    counts = Counter(answers)
    top = max(counts.values())
    winner = next(a for a in answers if counts[a] == top)
    return rewards[answers.index(winner)] == 1.0


def test_eval_cons_k_averages_majority_votes_over_all_k_subsets():
    answers = ["7", "3", "7", "3", "5", "4", "4", "4"]
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    n, k = 4, 3
    expected = 0.0
    for start in (0, 4):
        group_answers, group_rewards = answers[start : start + n], rewards[start : start + n].tolist()
        subsets = list(itertools.combinations(range(n), k))
        wins = sum(_majority_by_hand([group_answers[i] for i in s], [group_rewards[i] for i in s]) for s in subsets)
        expected += wins / len(subsets)
    # problem 1: subsets {7,3,7},{7,3,3},{7,7,3},{3,7,3} -> 7 wins twice, 3 wins twice: 0.5; problem 2: never
    assert expected == 0.5
    assert eval_cons_k(rewards, n, k, answers) == pytest.approx(expected, abs=1e-12)
    # k = n is plain majority voting over all samples; a tie goes to the answer seen first
    assert eval_cons_k(rewards[:4], 4, 4, answers[:4]) == 1.0
    assert eval_cons_k(torch.tensor([0.0, 1.0, 1.0]), 3, 3, ["2", "9", "9"]) == 1.0
    # a sample without an answer abstains
    assert eval_cons_k(torch.tensor([0.0, 0.0, 1.0]), 3, 3, [None, None, "9"]) == 1.0
    with pytest.raises(ValueError, match="1 <= k <= num_tests_per_prompt"):
        eval_cons_k(rewards, 4, 5, answers)


# ---------------------------------------------------------------------------------------------------------------
# environments.interfaces
# ---------------------------------------------------------------------------------------------------------------


class _EchoLengthEnv(EnvironmentInterface[dict]):
    """A NeMo-RL-style custom environment: reward = 1 when the answer has an even length."""

    def step(self, message_log_batch, metadata):
        answers = [log[-1]["content"] for log in message_log_batch]
        return EnvironmentReturn(
            observations=[{"role": "environment", "content": "done"} for _ in answers],
            metadata=metadata,
            next_stop_strings=[None] * len(answers),
            rewards=torch.tensor([float(len(a) % 2 == 0) for a in answers]),
            terminateds=torch.ones(len(answers), dtype=torch.bool),
        )

    def global_post_process_and_metrics(self, batch):
        return batch, {"accuracy": float(batch["rewards"].mean())}


def test_environment_interface_and_return_fields():
    assert EnvironmentReturn._fields == (
        "observations",
        "metadata",
        "next_stop_strings",
        "rewards",
        "terminateds",
        "answers",
    )
    env = _EchoLengthEnv()
    logs = [[{"role": "assistant", "content": "ab"}], [{"role": "assistant", "content": "abc"}]]
    result = env.step(logs, [{"i": 0}, {"i": 1}])
    assert result.answers is None  # NeMo-RL's default
    assert result.rewards.tolist() == [1.0, 0.0]
    _, metrics = env.global_post_process_and_metrics({"rewards": result.rewards})
    assert metrics == {"accuracy": 0.5}


# ---------------------------------------------------------------------------------------------------------------
# data.*
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-random-llama")


def test_get_formatted_message_log_nemo_rl_arguments(tokenizer):
    spec = TaskDataSpec(task_name="math", prompt="Solve: {}")
    log = get_formatted_message_log(
        [{"role": "user", "content": "1+1"}], tokenizer, spec, add_eos_token=False, add_generation_prompt=True
    )
    reference = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Solve: 1+1"}], tokenize=False, add_generation_prompt=True
    )
    assert log[0]["content"] == reference  # the template already starts with BOS: nothing added
    assert log[0]["token_ids"].tolist() == tokenizer.encode(reference, add_special_tokens=False)

    plain = copy.deepcopy(tokenizer)
    plain.chat_template = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    log = get_formatted_message_log(conversation, plain, None)  # NeMo-RL defaults: add BOS and EOS
    assert log[0]["content"] == plain.bos_token + "user: hi\n"
    assert log[0]["token_ids"][0].item() == plain.bos_token_id
    assert log[1]["content"] == "assistant: yo\n" + plain.eos_token
    assert log[1]["token_ids"][-1].item() == plain.eos_token_id
    assert len(log[1]["token_ids"]) == len(plain.encode("assistant: yo\n", add_special_tokens=False)) + 1


def test_loss_mask_only_unmask_final_ignores_roles_like_nemo_rl():
    log = [
        {"role": "assistant", "content": "a", "token_ids": torch.tensor([1, 2])},
        {"role": "environment", "content": "b", "token_ids": torch.tensor([3])},
    ]
    add_loss_mask_to_message_log([log], roles_to_train_on=["Assistant"])
    assert [m["token_loss_mask"].tolist() for m in log] == [[1, 1], [0]]
    add_loss_mask_to_message_log(batch_message_log=[log], only_unmask_final=True)
    assert [m["token_loss_mask"].tolist() for m in log] == [[0, 0], [1]]
    assert message_log_shape(log) == [
        {"token_ids": torch.Size([2]), "token_loss_mask": torch.Size([2])},
        {"token_ids": torch.Size([1]), "token_loss_mask": torch.Size([1])},
    ]


def test_small_data_helpers():
    assert get_first_index_that_differs("abcX", "abcY") == 3
    assert get_first_index_that_differs("abc", "abcdef") == 3
    dataset = Dataset.from_dict({"question": ["q"], "answer": ["a"]})
    remapped = remap_dataset_keys(dataset, {"question": "problem", "answer": "answer"})
    assert remapped.column_names == ["problem", "answer"] and remapped[0] == {"problem": "q", "answer": "a"}
    assert remap_dataset_keys(dataset, {"answer": "answer"}) is dataset
    with pytest.raises(KeyError, match=r"columns \['prompt'\] are not in the dataset"):
        remap_dataset_keys(dataset, {"prompt": "problem"})
    spec = TaskDataSpec()
    spec.copy_defaults(TaskDataSpec(task_name="math", prompt="P: {}", system_prompt="S"))
    assert (spec.prompt, spec.system_prompt) == ("P: {}", "S")
    # the NeMo-RL type names are the shapes our code uses
    assert FlatMessagesType == dict[str, list[Any] | torch.Tensor]
    assert DatumSpec.__required_keys__ >= {"message_log", "length", "extra_env_info", "loss_multiplier", "idx"}
    assert TaskDataProcessFnCallable is TaskDataProcessFn
    assert TokenizerType.__name__ == "PreTrainedTokenizerBase"


def test_packed_tensor():
    a, b, c = torch.arange(3), torch.arange(3, 5), torch.arange(5, 9)
    packed = PackedTensor([a, None, b], dim_to_pack=0)
    assert len(packed) == 3
    assert packed.as_tensor().tolist() == [0, 1, 2, 3, 4]
    assert packed.slice([2, 0]).as_tensor().tolist() == [3, 4, 0, 1, 2]
    assert packed.slice(torch.tensor([1])).as_tensor() is None
    other = PackedTensor(c, dim_to_pack=0)
    concat = PackedTensor.concat([packed, other])
    flat = PackedTensor.flattened_concat([packed, other])
    assert len(concat) == 4 and len(flat) == 2
    assert torch.equal(concat.as_tensor(), flat.as_tensor())
    assert len(PackedTensor.empty_like(packed)) == 3 and PackedTensor.empty_like(packed).as_tensor() is None
    columns = PackedTensor([torch.ones(2, 1), torch.zeros(2, 3)], dim_to_pack=1)
    assert columns.as_tensor().shape == (2, 4)
    with pytest.raises(ValueError, match="different dims"):
        PackedTensor.concat([packed, columns])
    with pytest.raises(ValueError, match="at least one entry"):
        PackedTensor([], dim_to_pack=0)


def test_processor_queries_on_a_text_tokenizer(tokenizer):
    assert get_multimodal_keys_from_processor(tokenizer) == []
    assert get_dim_to_pack_along(tokenizer, "pixel_values") == 0
    with pytest.raises(NotImplementedError, match=r"loading images .* not supported yet"):
        resolve_to_image("cat.png")


# ---------------------------------------------------------------------------------------------------------------
# algorithms.utils
# ---------------------------------------------------------------------------------------------------------------


def test_calculate_kl_estimators_and_clamps():
    logprobs = torch.tensor([-1.0, -2.0, -0.5, -30.0])
    reference = torch.tensor([-1.5, -1.0, -0.5, -1.0])
    d = (reference - logprobs).clamp(-20, 20)
    assert torch.allclose(calculate_kl(logprobs, reference, "k1", None, None), -(reference - logprobs))
    assert torch.allclose(calculate_kl(logprobs, reference, "k2", None, None), (reference - logprobs) ** 2 / 2)
    k3 = calculate_kl(logprobs, reference)  # NeMo-RL defaults: k3, input clamp 20, output clamp 10
    assert torch.allclose(k3, (d.exp() - d - 1).clamp(max=10.0))
    assert k3[2] == 0.0 and k3[3] == 10.0
    assert torch.equal(calculate_kl(logprobs, reference, "k3", 20.0, None), d.exp() - d - 1)
    with pytest.raises(ValueError, match=r"kl_type must be one of \['k1', 'k2', 'k3'\], got 'k4'"):
        calculate_kl(logprobs, reference, "k4")


def test_calculate_baseline_and_std_per_prompt_matches_a_per_sample_loop():
    prompts = torch.tensor([[1, 2], [3, 4], [1, 2], [1, 2], [3, 4], [5, 6], [1, 2]])
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.7, 0.5], dtype=torch.float64)
    valid = torch.tensor([1, 1, 1, 0, 1, 1, 1])
    for leave_one_out in (True, False):
        baseline, std = calculate_baseline_and_std_per_prompt(prompts, rewards, valid, leave_one_out)
        for i in range(len(rewards)):
            same = [j for j in range(len(rewards)) if torch.equal(prompts[j], prompts[i])]
            valid_in_group = [j for j in same if valid[j]]
            others = [j for j in valid_in_group if not (leave_one_out and j == i)]
            if len(valid_in_group) <= 1:
                expected_baseline, expected_std = rewards[i].item(), 0.0
            else:
                values = [rewards[j].item() for j in others]
                divisor = len(valid_in_group) - int(leave_one_out)  # NeMo-RL divides by this, also for i invalid
                expected_baseline = sum(values) / divisor
                mean_sq = sum(v * v for v in values) / divisor
                var = (mean_sq - expected_baseline**2) * divisor / (divisor - 1) if divisor > 1 else float("nan")
                expected_std = math.sqrt(var) if var == var and var >= 0 else 0.0
            assert baseline[i].item() == pytest.approx(expected_baseline, abs=1e-12), (leave_one_out, i)
            assert std[i].item() == pytest.approx(expected_std, abs=1e-12), (leave_one_out, i)


def test_nemo_rl_small_helpers(tmp_path):
    @surpress_user_warnings
    def noisy():
        warnings.warn("ignored", UserWarning, stacklevel=1)
        return 3

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert noisy() == 3

    set_seed(5)
    first = (torch.rand(2), torch.randn(1))
    set_seed(5)
    assert all(torch.equal(x, y) for x, y in zip(first, (torch.rand(2), torch.randn(1)), strict=True))

    logprobs = torch.tensor([-1.0, float("-inf"), -2.0])
    masked = mask_out_neg_inf_logprobs(logprobs, torch.tensor([1.0, 1.0, 0.0]), "prev_logprobs")
    assert masked.tolist() == [-1.0, 0.0, 0.0]

    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}|{% endfor %}")
    tokenizer = get_tokenizer({"name": "tiny-random-llama", "chat_template": str(template)})
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "hi|"
    assert tokenizer.pad_token is not None
    with pytest.raises(NotImplementedError, match="get_processor=True"):
        get_tokenizer({"name": "tiny-random-llama"}, get_processor=True)
