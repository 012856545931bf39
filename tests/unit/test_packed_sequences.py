"""`models/policy/workers/packed_sequences.py`: a microbatch run as one packed row gives the padded rows' logits, logprobs,
losses and gradients (fp64 for the attention itself; fp32 through the real losses, 1e-5)."""

import pytest
import torch

from nemo_rl_clone.algorithms.loss import ClippedPGLossFn, NLLLossFn
from nemo_rl_clone.contract.loss import TokenLogprobs
from nemo_rl_clone.contract.sampling import TrainingSamplingParams
from nemo_rl_clone.distributed.model_utils import valid_counts
from nemo_rl_clone.models.policy.workers import token_logprob_head
from nemo_rl_clone.models.policy.workers.packed_sequences import PACKED_ATTENTION, PackedRows, PaddedRows, rows_for
from nemo_rl_clone.models.policy.workers.token_logprob_head import Selection, next_token_selection
from tests.unit.test_token_logprob_head import _batch, tiny_llama

LENGTHS = torch.tensor([12, 9, 5, 11])  # _batch()'s rows


def packed_model(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    model = tiny_llama().to(dtype)
    model.set_attn_implementation(PACKED_ATTENTION)
    return model


def test_pack_and_unpack_are_inverse_on_valid_positions() -> None:
    rows = PackedRows(LENGTHS, 12)
    padded = torch.arange(4 * 12).reshape(4, 12)
    packed = rows.pack(padded)
    assert packed.shape == (1, int(LENGTHS.sum()))
    assert packed[0, :12].tolist() == list(range(12)) and packed[0, 12:21].tolist() == list(range(12, 21))
    assert rows.position_ids[0, 12:21].tolist() == list(range(9))  # positions restart per sample
    assert rows.cu_seqlens.tolist() == [0, 12, 21, 26, 37]
    restored = rows.unpack(packed)
    assert (restored[rows.valid] == padded[rows.valid]).all() and (restored[~rows.valid] == 0).all()
    assert rows.num_tokens == 37


def test_packed_logits_and_gradients_equal_each_sample_run_alone() -> None:
    """fp64, so only the attention's grouping can make a difference: each sample run unpadded on its own is the
    reference."""
    data = _batch()
    reference = packed_model(torch.float64)
    expected = [
        reference(input_ids=data["input_ids"][i : i + 1, :length]).logits[0] for i, length in enumerate(LENGTHS)
    ]
    sum(logits.sum() for logits in expected).backward()

    model = packed_model(torch.float64)
    rows = PackedRows(LENGTHS, 12)
    logits = rows.unpack(model(input_ids=rows.pack(data["input_ids"]), **rows.model_kwargs()).logits)
    logits[rows.valid].sum().backward()

    for i, length in enumerate(LENGTHS):
        torch.testing.assert_close(logits[i, :length], expected[i], atol=1e-12, rtol=0)
    for (name, param), (_, ref) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
        torch.testing.assert_close(param.grad, ref.grad, atol=1e-10, rtol=1e-10, msg=name)


def test_without_boundaries_the_packed_row_attends_across_samples() -> None:
    """The boundaries are what keeps attention inside a sample: position ids alone do not (so the test above
    can fail)."""
    data = _batch()
    model = packed_model(torch.float64)
    rows = PackedRows(LENGTHS, 12)
    kwargs = rows.model_kwargs()
    bounded = model(input_ids=rows.pack(data["input_ids"]), **kwargs).logits
    unbounded = model(input_ids=rows.pack(data["input_ids"]), position_ids=kwargs["position_ids"]).logits
    assert torch.equal(bounded[0, :12], unbounded[0, :12])  # the first sample sees nothing before it either way
    assert (bounded[0, 12:] - unbounded[0, 12:]).abs().max() > 1e-3


@pytest.mark.parametrize("selective_head", [False, True], ids=["full_logits", "selective_head"])
@pytest.mark.parametrize("loss_name", ["clipped_pg", "clipped_pg_top_k_top_p", "nll"])
def test_packed_losses_and_gradients_equal_the_padded_path(loss_name: str, selective_head: bool) -> None:
    """The worker's two loss inputs (full logits; token logprobs from the selective head), packed vs padded:
    same loss, metrics and parameter gradients in fp32 to 1e-5; also under the sampler's temperature, top-k and
    top-p (the head then returns the filtered and the KL term's unfiltered logprobs from one projection)."""
    data = _batch()
    pg = {"force_on_policy_ratio": True, "reference_policy_kl_penalty": 0.1}
    loss_fn = {
        "clipped_pg": ClippedPGLossFn(pg),
        "clipped_pg_top_k_top_p": ClippedPGLossFn(pg, TrainingSamplingParams(temperature=0.7, top_k=5, top_p=0.9)),
        "nll": NLLLossFn(),
    }[loss_name]
    sampling = getattr(loss_fn, "sampling_params", None)
    both = bool(getattr(loss_fn, "needs_unfiltered_logprobs", False))
    seqs, toks = valid_counts(data)

    def run(packed: bool) -> tuple[torch.Tensor, dict, torch.nn.Module]:
        model = packed_model()
        rows = rows_for(data["input_ids"], data["input_lengths"], packed)
        assert isinstance(rows, PackedRows if packed else PaddedRows)
        head = token_logprob_head.install(model) if selective_head else None
        if head is None:
            logits = rows.unpack(model(input_ids=rows.pack(data["input_ids"]), **rows.model_kwargs()).logits)
            loss, metrics = loss_fn(logits, data, seqs, toks)
        else:
            positions, targets = next_token_selection(data["input_ids"], data["token_mask"][:, 1:] > 0)
            selection = Selection(rows.pack(positions), rows.pack(targets), 5, torch.float32, None, sampling, both)
            with head.selecting(selection):
                out = rows.unpack(model(input_ids=rows.pack(data["input_ids"]), **rows.model_kwargs()).logits)
            given = TokenLogprobs(out[:, :-1, 0], out[:, :-1, 1]) if both else TokenLogprobs(out[:, :-1])
            loss, metrics = loss_fn(given, data, seqs, toks)
        loss.backward()
        return loss, metrics, model

    expected, expected_metrics, padded_model = run(packed=False)
    got, got_metrics, model = run(packed=True)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    for key, value in expected_metrics.items():
        assert got_metrics[key] == pytest.approx(value, abs=1e-5), key
    for (name, param), (_, ref) in zip(model.named_parameters(), padded_model.named_parameters(), strict=True):
        torch.testing.assert_close(param.grad, ref.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_bad_lengths_and_missing_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match=r"packed rows need 1 <= input_lengths <= 12 \(the row width\), got \[12, 0\]"):
        PackedRows(torch.tensor([12, 0]), 12)
    with pytest.raises(KeyError, match="sequence packing needs the batch's 'input_lengths'"):
        rows_for(torch.zeros(2, 3, dtype=torch.long), None, packed=True)
