"""docs/config_reference.md is what `examples/config_reference.py` generates from the schemas, and ``explain``
prints a key's row (or a section's rows) and refuses an unknown key in one line naming the closest ones."""

from __future__ import annotations

import pytest

from tests.scripts import REPO, load_script

reference = load_script(REPO / "examples" / "config_reference.py", "config_reference", register=True)


@pytest.fixture(scope="module")
def rows() -> list:
    return reference.reference_rows()


def test_the_page_is_the_schemas(rows: list) -> None:
    page = (REPO / "docs" / "config_reference.md").read_text()
    assert page == reference.render(rows), (
        "docs/config_reference.md is stale: uv run examples/config_reference.py write"
    )


def test_every_schema_key_and_every_refused_nemo_rl_key_has_a_row(rows: list) -> None:
    keys = {row.key for row in rows}
    assert {"grpo.adv_estimator.std", "policy.megatron_cfg.train_iters", "eval.num_tests_per_prompt"} <= keys
    assert "…generation.sglang_cfg" in keys  # a NeMo-RL key refused by name under any section ("…")
    assert all(row.built in ("yes", "not supported yet") for row in rows)


def test_explain_prints_a_key_with_its_comment_type_default_and_allowed_values(rows: list) -> None:
    text = reference.explain("grpo.adv_estimator.std", rows)
    assert text.splitlines()[0] == "grpo.adv_estimator.std"
    assert 'what it does: "leave_one_out": NeMo-RL\'s' in text
    assert "default: `'leave_one_out'`" in text and "allowed values: `leave_one_out`, `group`" in text
    assert "read by: grpo" in text and "built: yes" in text
    section = reference.explain("watchdog", rows)
    assert "watchdog.stop_min_s" in section and "watchdog.warn_factor" in section


def test_an_unknown_key_is_refused_naming_the_closest(rows: list) -> None:
    with pytest.raises(SystemExit) as stop:
        reference.explain("grpo.adv_estimator.stdd", rows)
    assert str(stop.value).startswith(
        "error: no config key 'grpo.adv_estimator.stdd' (did you mean grpo.adv_estimator.std"
    )
