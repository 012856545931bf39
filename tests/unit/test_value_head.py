"""PPO's critic head (``reward_model_type: regression``): the per-token values a critic policy worker returns, checked
against a plain Hugging Face forward (single process, no Ray).

The layout is the one GAE, the actor's per-token advantages and the value loss share: ``values[:, t]`` is the head
at position t − 1, the value of the state in which token t is generated; 0 at t = 0. Padded rows and packed rows
(sequence packing) must give the same values at every valid position.
"""

from __future__ import annotations

import torch

from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer, resolve_model_path
from nemo_rl_clone.models.policy.workers.packed_sequences import PackedRows
from nemo_rl_clone.models.policy.workers.reward_model import (
    LastTokenScorer,
    TokenValueScorer,
    load_reward_model,
    make_scorer,
)


def _model_and_batch() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    path = resolve_model_path(TINY_LLAMA)
    model = load_reward_model(path, load_tokenizer(path).pad_token_id)
    model.eval()
    generator = torch.Generator().manual_seed(0)
    lengths = torch.tensor([7, 3, 5])
    ids = torch.randint(3, 200, (3, 7), generator=generator)
    ids[torch.arange(7)[None, :] >= lengths[:, None]] = 2  # right padding with the pad id
    return model, ids, lengths


def test_values_are_the_head_one_position_back_and_zero_at_the_first_token():
    model, ids, lengths = _model_and_batch()
    with torch.no_grad():
        head = model.score(model.model(input_ids=ids).last_hidden_state)[..., 0]  # [B, S]: after reading ≤ t
        values = TokenValueScorer(model)(ids, lengths)
    assert values.shape == ids.shape
    torch.testing.assert_close(values[:, 1:], head[:, :-1], atol=1e-5, rtol=0)
    assert (values[:, 0] == 0).all()


def test_packed_rows_give_the_padded_values_at_every_valid_position():
    model, ids, lengths = _model_and_batch()
    scorer = TokenValueScorer(model)
    with torch.no_grad():
        padded = scorer(ids, lengths)
        packed = scorer(ids, lengths, PackedRows(lengths, ids.shape[1]))
    valid = torch.arange(ids.shape[1])[None, :] < lengths[:, None]
    torch.testing.assert_close(packed[valid], padded[valid], atol=1e-5, rtol=0)


def test_the_reward_model_type_picks_the_scorer():
    model, _, _ = _model_and_batch()
    assert type(make_scorer(model, "regression")) is TokenValueScorer
    assert type(make_scorer(model, "bradley_terry")) is LastTokenScorer
