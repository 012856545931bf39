"""NeMo-RL's modules for features not built here (`nemo_rl_clone.facades.REFUSED`) stop with one line naming the
feature when imported: an ImportError and a user-input error, printed without a traceback in a user's own script."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_rl_clone.facades import REFUSED
from nemo_rl_clone.utils.errors import UserInputError, reporting_user_errors
from nemo_rl_clone.utils.unsupported_modules import UnsupportedFeatureError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("module", sorted(REFUSED))
def test_a_refused_module_stops_with_one_line_naming_its_feature(module: str, monkeypatch) -> None:
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # the refusal installs its report; keep the session's
    with pytest.raises(ImportError) as caught:
        importlib.import_module(module)
    assert isinstance(caught.value, UserInputError) and caught.value.name == module
    assert str(caught.value) == f"{module}: not supported yet: {REFUSED[module]}"
    assert module not in sys.modules  # a second import stops again, with the same line


def test_a_module_under_a_refused_package_is_refused_too(monkeypatch) -> None:
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    with pytest.raises(UnsupportedFeatureError, match=r"^nemo_rl_clone\.modelopt: not supported yet: ModelOpt"):
        from nemo_rl_clone.modelopt.models.policy.workers import utils  # noqa: F401


def test_an_entry_point_reports_it_as_a_user_error(capfd, monkeypatch) -> None:
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    with pytest.raises(SystemExit) as stopped, reporting_user_errors():
        importlib.import_module("nemo_rl_clone.environments.nemo_gym")
    assert stopped.value.code == 2
    expected = "error: nemo_rl_clone.environments.nemo_gym: not supported yet: NeMo-Gym environments\n"
    assert capfd.readouterr().err == expected


def test_a_users_script_prints_one_line_and_no_traceback(tmp_path: Path) -> None:
    script = tmp_path / "run_with_rollout_actor.py"
    module = "nemo_rl_clone.experience.sync_rollout_actor"
    script.write_text(f"from {module} import SyncRolloutActor\nprint('not reached')\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"error: {module}: not supported yet: {REFUSED[module]}\n"


def test_a_built_module_refuses_nemo_rl_names_of_an_unbuilt_feature(monkeypatch) -> None:
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    rollouts = importlib.import_module("nemo_rl_clone.experience.rollouts")
    with pytest.raises(ImportError) as caught:
        from nemo_rl_clone.experience.rollouts import run_async_nemo_gym_rollout  # noqa: F401
    expected = "nemo_rl_clone.experience.rollouts.run_async_nemo_gym_rollout: not supported yet: NeMo-Gym environments"
    assert isinstance(caught.value, UnsupportedFeatureError) and str(caught.value) == expected
    assert callable(rollouts.run_multi_turn_rollout)
    with pytest.raises(AttributeError, match="has no attribute 'run_multi_turn_rolout'"):
        _ = rollouts.run_multi_turn_rolout  # a typo stays an ordinary AttributeError
