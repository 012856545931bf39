"""NeMo-RL's scripts build ``MasterConfig(**config)`` from the whole YAML config. NeMo-RL's master configs take keys
they do not know (pydantic, ``extra="allow"``); ours take them too, keep them readable, and refuse each in one line
when ``setup()`` validates the config — where NeMo-RL would ignore a misspelt section. Run outside any CLI of ours,
that refusal is one ``error:`` line, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nemo_rl_clone.algorithms.distillation.config import DistillationMasterConfig
from nemo_rl_clone.algorithms.dpo.config import DPOMasterConfig
from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
from nemo_rl_clone.algorithms.ppo.config import PPOMasterConfig
from nemo_rl_clone.algorithms.rm.config import RMMasterConfig
from nemo_rl_clone.algorithms.sft.config import SFTMasterConfig
from nemo_rl_clone.utils.config import load_config
from nemo_rl_clone.utils.config_validation import ConfigError, as_config

REPO = Path(__file__).resolve().parents[2]
MASTER_CONFIGS = {
    "grpo": GRPOMasterConfig,
    "ppo": PPOMasterConfig,
    "distillation": DistillationMasterConfig,
    "sft": SFTMasterConfig,
    "dpo": DPOMasterConfig,
    "rm": RMMasterConfig,
}


def smoke_config(name: str) -> dict:
    config = OmegaConf.to_container(load_config(REPO / "configs" / f"{name}_smoke.yaml"), resolve=True)
    assert isinstance(config, dict)
    return config


@pytest.mark.parametrize("name", sorted(MASTER_CONFIGS))
def test_an_unknown_top_level_key_is_kept_then_refused_in_one_line(name: str, monkeypatch) -> None:
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # validation installs its one-line report; keep pytest's
    schema = MASTER_CONFIGS[name]
    config = schema(**smoke_config(name), my_notes={"owner": "me"}, grop={"max_num_steps": 3})
    assert config.my_notes == {"owner": "me"}  # readable, as on NeMo-RL's model
    with pytest.raises(ConfigError) as refused:
        as_config(config, schema)
    assert sorted(refused.value.problems) == [
        "grop: unknown key (did you mean grpo?)" if name == "grpo" else "grop: unknown key",
        "my_notes: unknown key",
    ]
    assert as_config(schema(**smoke_config(name)), schema) is not None  # without them it validates


def test_a_script_of_nemo_rl_form_gets_one_line_not_a_traceback(tmp_path: Path) -> None:
    script = tmp_path / "run_grpo_with_a_typo.py"
    script.write_text(
        "from omegaconf import OmegaConf\n"
        "from nemo_rl_clone.algorithms.grpo import MasterConfig, setup\n"
        "from nemo_rl_clone.utils.config import load_config\n"
        f"config = OmegaConf.to_container(load_config({str(REPO / 'configs' / 'grpo_smoke.yaml')!r}), resolve=True)\n"
        "config['polcy'] = {}\n"
        "setup(MasterConfig(**config), object(), [])\n"
        "print('not reached')\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == "error: polcy: unknown key (did you mean policy?)\n"


def test_a_section_given_alone_knows_nemo_rl_s_keys_by_their_full_path(tmp_path: Path) -> None:
    """NeMo-RL's ``CheckpointManager(config)`` takes the ``checkpointing`` dict of its recipes, whose Automodel keys
    are off: accepted here, and refused by name when on (as in a whole config), not called unknown."""
    from nemo_rl_clone.utils.checkpoint import CheckpointManager

    section = {"enabled": True, "checkpoint_dir": str(tmp_path), "model_cache_dir": None, "is_peft": False}
    assert CheckpointManager(section).cfg.checkpoint_dir == str(tmp_path)
    with pytest.raises(ConfigError) as refused:
        CheckpointManager({**section, "is_peft": True, "keep_top_kk": 1})
    assert refused.value.problems == [
        "checkpointing.is_peft: not supported yet: NeMo Automodel's PEFT checkpoints (NeMo-RL's key, set to True)",
        "checkpointing.keep_top_kk: unknown key (did you mean checkpointing.keep_top_k?)",
    ]


@pytest.mark.parametrize("name", sorted(MASTER_CONFIGS))
def test_the_validated_config_reads_like_nemo_rl_s_dict_sections(name: str) -> None:
    """Code written for NeMo-RL reads the master config ``setup`` returns by section and key, at any depth."""
    config = as_config(smoke_config(name), MASTER_CONFIGS[name])
    policy = config.policy
    assert policy["model_name"] == policy.model_name and policy.get("model_name") == policy.model_name
    assert policy["optimizer"]["kwargs"] == policy.optimizer.kwargs  # a nested section reads the same way
    assert "train_global_batch_size" in policy and "train_global_batch_sizes" not in policy
    assert policy.get("no_such_key", 7) == 7
    with pytest.raises(KeyError, match="no_such_key"):
        policy["no_such_key"]
    loop = config[name]
    assert loop["max_num_steps"] == loop.max_num_steps
    if name in ("grpo", "ppo", "distillation"):
        generation = policy["generation"]
        assert generation["vllm_cfg"]["gpu_memory_utilization"] == generation.vllm_cfg.gpu_memory_utilization
