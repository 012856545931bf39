"""`nemo_rl_clone.models.policy.dtensor.lora` in one process, against peft's own PeftModel as the reference: which layers get
adapters, that a fresh adapter changes nothing, that merging equals peft's merge, that switching the adapters off gives
the base model, and that the exported adapter folder loads in peft. fp32 throughout; tolerances 1e-5 absolute on
logits of order 1 (only the order of float sums differs)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from nemo_rl_clone.models.huggingface import TINY_LLAMA, resolve_model_path
from nemo_rl_clone.models.policy.config import LoraConfig
from nemo_rl_clone.models.policy.dtensor import lora

INPUT_IDS = torch.tensor([[5, 17, 42, 8, 99, 3, 64, 21], [7, 7, 120, 11, 2, 56, 90, 13]])


@pytest.fixture(scope="module")
def model_path() -> str:
    return resolve_model_path(TINY_LLAMA)


def load(model_path: str) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=INPUT_IDS).logits


def trained_lora_model(model_path: str, config: LoraConfig) -> torch.nn.Module:
    """A LoRA model whose adapters are no longer a no-op (random lora_B, as after some training)."""
    model = load(model_path)
    lora.apply(model, config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    return model


# ---------------------------------------------------------------------------- which layers
def test_all_linear_targets_every_projection_but_the_head(model_path: str) -> None:
    names = lora.target_module_names(load(model_path), LoraConfig(enabled=True))
    suffixes = sorted({name.rsplit(".", 1)[-1] for name in names})
    assert suffixes == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    assert len(names) == 2 * 7 and "lm_head" not in names  # 2 layers x 7 projections


def test_target_and_exclude_patterns(model_path: str) -> None:
    model = load(model_path)
    plain = LoraConfig(enabled=True, match_all_linear=False, target_modules=["q_proj", "self_attn.v_proj"])
    assert lora.target_module_names(model, plain) == [
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.v_proj",
        "model.layers.1.self_attn.q_proj",
        "model.layers.1.self_attn.v_proj",
    ]
    wildcard = LoraConfig(
        enabled=True, match_all_linear=False, target_modules=["model.layers.*.mlp.*"], exclude_modules=["up_proj"]
    )
    assert lora.target_module_names(model, wildcard) == [
        "model.layers.0.mlp.gate_proj",
        "model.layers.0.mlp.down_proj",
        "model.layers.1.mlp.gate_proj",
        "model.layers.1.mlp.down_proj",
    ]
    # NeMo-RL's Nemotron-H LoRA recipe: no targets named, some excluded -> every linear layer but those (Automodel's).
    everything = lora.target_module_names(model, LoraConfig(enabled=True))
    all_but = LoraConfig(enabled=True, match_all_linear=False, exclude_modules=["o_proj"])
    assert lora.target_module_names(model, all_but) == [name for name in everything if not name.endswith("o_proj")]
    assert len(everything) == 2 * 7


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            LoraConfig(enabled=True, match_all_linear=False, target_modules=["qkv_proj"]),
            "policy.dtensor_cfg.lora_cfg.target_modules: 'qkv_proj' matches no linear layer of LlamaForCausalLM "
            "(the output head excluded); its linear layers end in ['down_proj', 'gate_proj', 'k_proj', 'o_proj', "
            "'q_proj', 'up_proj', 'v_proj']",
        ),
        (
            LoraConfig(enabled=True, match_all_linear=False, target_modules=["lm_head"]),
            "policy.dtensor_cfg.lora_cfg.target_modules: 'lm_head' matches no linear layer",
        ),
        (
            LoraConfig(enabled=True, exclude_modules=["*proj"]),
            "policy.dtensor_cfg.lora_cfg.exclude_modules: excludes every targeted linear layer; nothing would train",
        ),
    ],
)
def test_bad_targets_name_the_key(model_path: str, config: LoraConfig, message: str) -> None:
    with pytest.raises(lora.LoraTargetError) as error:
        lora.target_module_names(load(model_path), config)
    assert str(error.value).startswith(message)


# ---------------------------------------------------------------------------- the adapted model
def test_fresh_adapters_change_nothing_and_only_they_train(model_path: str) -> None:
    base = logits(load(model_path))
    model = load(model_path)
    lora.apply(model, LoraConfig(enabled=True, dim=4))
    torch.testing.assert_close(logits(model), base, rtol=0, atol=0)  # lora_B starts at zero
    trainable = {name for name, param in model.named_parameters() if param.requires_grad}
    assert trainable and all(lora.is_adapter_key(name) for name in trainable)
    assert len(trainable) == 2 * 14  # lora_A and lora_B of 14 layers
    shape = dict(model.named_parameters())["model.layers.0.mlp.down_proj.lora_A.default.weight"].shape
    assert shape == (4, 256)  # [dim, in_features]


def test_lora_a_init(model_path: str) -> None:
    """xavier_normal: std sqrt(2 / (in + dim)); kaiming (peft's default): uniform with bound sqrt(1 / in). Either is
    seeded: every worker (and every rerun) starts from the same adapters, whatever the global RNG."""
    for init in ("xavier", "kaiming"):
        model, again = load(model_path), load(model_path)
        torch.manual_seed(0)
        lora.apply(model, LoraConfig(enabled=True, dim=8, lora_A_init=init))
        torch.manual_seed(1)
        lora.apply(again, LoraConfig(enabled=True, dim=8, lora_A_init=init))
        torch.testing.assert_close(model.state_dict(), again.state_dict(), rtol=0, atol=0)
        a = torch.cat(
            [p.flatten() for n, p in model.named_parameters() if ".lora_A." in n and "mlp.down_proj" not in n]
        )  # in_features 128 everywhere but down_proj
        if init == "xavier":
            assert a.std().item() == pytest.approx(math.sqrt(2 / (128 + 8)), rel=0.05)
        else:
            assert a.abs().max().item() <= math.sqrt(1 / 128) + 1e-7
            assert a.std().item() == pytest.approx(math.sqrt(1 / 128) / math.sqrt(3), rel=0.05)


def test_adapters_disabled_is_the_base_model(model_path: str) -> None:
    base = logits(load(model_path))
    model = trained_lora_model(model_path, LoraConfig(enabled=True))
    adapted = logits(model)
    assert (adapted - base).abs().max() > 1e-2  # the adapters do something
    with lora.adapters_disabled(model):
        torch.testing.assert_close(logits(model), base, rtol=0, atol=0)
    torch.testing.assert_close(logits(model), adapted, rtol=0, atol=0)
    assert all(p.requires_grad for n, p in model.named_parameters() if lora.is_adapter_key(n))


def test_merged_state_dict_equals_peft_merge(model_path: str) -> None:
    config = LoraConfig(enabled=True, dim=4, alpha=16)
    model = trained_lora_model(model_path, config)
    merged = lora.merged_state_dict(model.state_dict(), config.scaling)

    fresh = load(model_path)
    assert merged.keys() == fresh.state_dict().keys()  # the base model's own names
    fresh.load_state_dict(merged)
    torch.testing.assert_close(logits(fresh), logits(model), rtol=0, atol=1e-5)

    # peft's own merge of the same adapters (copied over by name).
    peft_model = get_peft_model(
        load(model_path), PeftLoraConfig(r=4, lora_alpha=16, target_modules="all-linear", bias="none")
    )
    adapters = {k: v for k, v in model.state_dict().items() if lora.is_adapter_key(k)}
    missing = peft_model.base_model.model.load_state_dict(adapters, strict=False)
    assert not missing.unexpected_keys
    peft_merged = peft_model.merge_and_unload().state_dict()
    for name, tensor in merged.items():
        torch.testing.assert_close(tensor, peft_merged[name], rtol=0, atol=1e-6)


def test_saved_adapter_loads_in_peft(model_path: str, tmp_path: Path) -> None:
    config = LoraConfig(enabled=True, match_all_linear=False, target_modules=["q_proj", "v_proj"], dim=2, alpha=4)
    model = trained_lora_model(model_path, config)
    adapters = {k: v for k, v in model.state_dict().items() if lora.is_adapter_key(k)}
    out = lora.save_peft_adapter(adapters, config, model_path, tmp_path / "adapter")
    assert sorted(p.name for p in out.iterdir()) == [lora.PEFT_ADAPTER_CONFIG, lora.PEFT_ADAPTER_WEIGHTS]
    loaded = PeftModel.from_pretrained(load(model_path), str(out)).eval()
    torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=1e-5)


def test_merge_needs_the_base_weight() -> None:
    adapters = {
        "layer.lora_A.default.weight": torch.zeros(2, 3),
        "layer.lora_B.default.weight": torch.zeros(3, 2),
    }
    with pytest.raises(KeyError) as error:
        lora.merge_adapters({"other.weight": torch.zeros(3, 3)}, adapters, 1.0)
    assert "adapter 'layer' has no base weight 'layer.weight' to merge into" in str(error.value)
