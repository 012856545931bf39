"""The rollout viewer in a real headless Chromium (Debian's ``chromium``) over a real GRPO smoke run's logs.

A 2-step `configs/grpo_smoke.yaml` run with ``loss_fn.force_on_policy_ratio=false`` (so the rows carry the trainer's
logprobs too) writes the logs; ``examples/view_rollouts.py`` serves them; Chromium loads the page, runs its scripts,
and the DOM it dumps must show the counts of the JSONL files; ``--screenshot`` must give a PNG with content.

Chromium is installed with apt-get when missing; where that cannot be done (no apt-get, not root) the test skips
and says why.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemo_rl_clone.viewer.chromium import dump_dom, find_chromium
from nemo_rl_clone.viewer.run_logs import find_run
from nemo_rl_clone.viewer.server import serving_in_background
from tests.functional.supervised_runs import REPO, run_dirs, run_entry_point
from tools.podman_base_image import PrerequisiteError, install_packages

# On the worker of the other "system" tests, one at a time (tests/machine_share.py): installs Chromium.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("system")]

PLOT_TITLES = {
    "reward",
    "accuracy",
    "response length (tokens)",
    "KL",
    "entropy",
    "mismatch (token_mult_prob_error)",
}


@pytest.fixture(scope="module")
def chromium() -> str:
    if find_chromium() is None:
        try:
            install_packages(["chromium", "fonts-dejavu-core"])
        except PrerequisiteError as error:
            pytest.skip(f"chromium cannot be installed here: {error}")
    path = find_chromium()
    assert path is not None, "apt-get installed chromium but it is not on PATH"
    return path


@pytest.fixture(scope="module")
def smoke_logs(module_tmp_path: Path) -> Path:
    run_entry_point(
        "grpo_math",
        module_tmp_path,
        "loss_fn.force_on_policy_ratio=false",
        "checkpointing.enabled=false",
        config="grpo_smoke.yaml",
    )
    return module_tmp_path / "logs"


@pytest.fixture
def viewer_url(smoke_logs: Path) -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "examples" / "view_rollouts.py"), str(smoke_logs), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        assert lines[1].startswith("rollout viewer: http://127.0.0.1:"), lines
        yield lines[1].split()[2]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _rows(run_dir: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (run_dir / f"train_data_step{step}.jsonl").read_text().splitlines()]


def _monitor_plot_titles(run_dir: Path) -> set[str]:
    """One plot of all the 0/1 `monitor/*_alert` keys, and one per other `monitor/*` statistic."""
    keys = {key for line in (run_dir / "metrics.jsonl").read_text().splitlines() for key in json.loads(line)}
    monitor_keys = {key for key in keys if key.startswith("monitor/")}
    assert monitor_keys, "a GRPO run logs monitor/* metrics every step"
    statistics = {key for key in monitor_keys if not key.endswith("_alert")}
    return {"monitor alerts (1 = alerting)"} | statistics


def _summary(dom: str) -> dict[str, str]:
    match = re.search(r'<p id="summary"([^>]*)>', dom)
    assert match, dom[-3000:]
    return dict(re.findall(r'data-(\w+)="([^"]*)"', match.group(1)))


def test_page_shows_the_runs_steps_samples_and_plots(chromium, smoke_logs, viewer_url) -> None:
    (run_dir,) = run_dirs(smoke_logs.parent)
    for step in (1, 2):
        rows = _rows(run_dir, step)
        assert all("tokens" in row and "trainer_logprobs" in row for row in rows)
        dom = dump_dom(f"{viewer_url}?step={step}")
        assert 'data-ready="1"' in dom and '<p id="error" hidden="">' in dom, dom[-3000:]
        assert _summary(dom) == {
            "step": str(step),
            "steps": "2",
            "samples": str(len(rows)),
            "groups": str(len({row["idx"] for row in rows})),
            "shown": str(len(rows)),
        }
        assert dom.count('class="sample"') == len(rows)
        assert dom.count('class="group"') == len({row["idx"] for row in rows})
        samples = dom[dom.index('<main id="samples">') :]  # the legend has token spans too
        token_spans = len(re.findall(r'<span class="tok[ "]', samples))
        assert token_spans == sum(len(row["tokens"]) for row in rows)
        # Gap colour on every trained token, grey (no colour) on the others.
        assert samples.count('style="background') == sum(sum(row["loss_mask"]) for row in rows)
        assert samples.count('class="tok masked"') == sum(row["loss_mask"].count(0) for row in rows)
        titles = set(re.findall(r'<figure class="plot" data-title="([^"]+)"', dom))
        assert titles == PLOT_TITLES | _monitor_plot_titles(run_dir)
        assert dom.count("<polyline") >= len(titles)
        assert "No gap colouring" not in dom  # the run computed the trainer's logprobs

    rows = _rows(run_dir, 1)
    truncated = sum(row["truncated"] for row in rows)
    dom = dump_dom(f"{viewer_url}?step=1&truncated=1&sort=mismatch")
    assert _summary(dom)["shown"] == str(truncated)
    assert dom.count('class="sample"') == truncated
    assert dom.count('class="badge truncated"') == truncated


def test_rows_without_trainer_logprobs_or_tokens_still_show(chromium, smoke_logs, tmp_path) -> None:
    """The main job's rows (no trainer logprobs: force_on_policy_ratio) and an older run's rows (text only)."""
    (source,) = run_dirs(smoke_logs.parent)
    run_dir = tmp_path / "exp_1"
    run_dir.mkdir()
    shutil.copy(source / "metrics.jsonl", run_dir)
    rows = _rows(source, 1)
    on_policy = [{k: v for k, v in row.items() if k != "trainer_logprobs"} for row in rows]
    text_only = [{k: row[k] for k in ("prompt", "response", "reward", "advantage", "idx")} for row in rows]
    for step, step_rows in ((1, on_policy), (2, text_only)):
        (run_dir / f"train_data_step{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in step_rows))
    with serving_in_background(find_run(tmp_path)) as server:
        on_policy_dom = dump_dom(f"{server.url}?step=1")
        text_dom = dump_dom(f"{server.url}?step=2")
    assert "No gap colouring: this run did not compute the trainer's logprobs" in on_policy_dom
    samples = on_policy_dom[on_policy_dom.index('<main id="samples">') :]
    assert 'style="background' not in samples and "|logprob gap|" not in samples
    assert len(re.findall(r'<span class="tok[ "]', samples)) == sum(len(row["tokens"]) for row in rows)
    assert "These rows carry text only" in text_dom
    assert text_dom.count('class="plain"') == len(rows) and 'class="tok' not in text_dom.split('<main id="samples">')[1]
    assert _summary(text_dom)["samples"] == str(len(rows))


def test_screenshot_has_content(chromium, smoke_logs, tmp_path) -> None:
    from PIL import Image

    png = tmp_path / "viewer.png"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "view_rollouts.py"),
            str(smoke_logs),
            "--screenshot",
            str(png),
            "--window-size",
            "1200,900",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"screenshot: {png}" in proc.stdout
    with Image.open(png) as image:
        assert image.size == (1200, 900)
        pixels = image.convert("RGB")
        colours = pixels.getcolors(maxcolors=1 << 20)
    assert colours is not None
    # Text, plot lines in several colours and the filter bar: many colours, and no one colour covering the page.
    assert len(colours) > 50, len(colours)
    assert max(count for count, _ in colours) < 0.9 * 1200 * 900
