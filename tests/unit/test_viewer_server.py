"""The rollout viewer's server (docs/rollout_viewer.md): its JSON endpoints over real HTTP on 127.0.0.1, the choice
of run in a log dir, bad log dirs, and the command line (serves until Ctrl-C, exits cleanly)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.viewer.run_logs import find_run
from nemo_rl_clone.viewer.server import ViewerServer, serving_in_background

# Runs alone (tests/machine_share.py): its Ctrl-C exit (30 s bound) timed out once beside a busy neighbour.
pytestmark = pytest.mark.serial

REPO = Path(__file__).resolve().parents[2]

TOKEN_ROW = {
    "prompt": "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n",
    "response": "ab c",
    "reward": 1.0,
    "advantage": 0.5,
    "idx": 3,
    "truncated": False,
    "tokens": ["a", "b", " c"],
    "segments": [["assistant", 3]],
    "generation_logprobs": [-0.5, -1.0, -2.0],
    "loss_mask": [1, 1, 0],
    "trainer_logprobs": [-0.25, -1.5, -9.0],  # the masked third token's large gap must not count
}
OLD_ROW = {"prompt": "p", "response": "text only", "reward": 0.0, "advantage": -0.5, "idx": 3}


def _write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    """Two runs; the latest, exp_2, has metrics for steps 0-2 and samples for steps 1 (tokens) and 2 (text only)."""
    (tmp_path / "exp_1").mkdir()
    _write_jsonl(tmp_path / "exp_1" / "metrics.jsonl", [{"step": 1, "train/reward": 9.0}])
    run = tmp_path / "exp_2"
    run.mkdir()
    _write_jsonl(
        run / "metrics.jsonl",
        [
            {"step": 0, "validation/accuracy": 0.25},
            {"step": 1, "train/reward": 0.5, "train/accuracy": 0.5, "train/lr": 1e-6, "note": "text"},
            {"step": 2, "train/reward": 0.75, "monitor/entropy_collapse": 1.0},
        ],
    )
    _write_jsonl(run / "train_data_step1.jsonl", [TOKEN_ROW, {**TOKEN_ROW, "reward": 0.0}])
    _write_jsonl(run / "train_data_step2.jsonl", [OLD_ROW])
    (tmp_path / "exp_3").mkdir()  # a run that started but logged nothing yet is not picked
    return tmp_path


def _get(url: str) -> tuple[int, object]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            body = response.read()
            status = response.status
            kind = response.headers["Content-Type"]
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
    return status, json.loads(body) if kind == "application/json" else body.decode()


def test_endpoints_serve_steps_rows_and_metrics(log_dir: Path) -> None:
    run = find_run(log_dir)
    assert run.run_dir == (log_dir / "exp_2").resolve()
    assert "exp_2" in run.note and "latest" in run.note
    with serving_in_background(run) as server:
        url = server.url
        assert url.startswith("http://127.0.0.1:")
        status, info = _get(url + "api/run")
        assert status == 200 and info["steps"] == [{"step": 1, "samples": 2}, {"step": 2, "samples": 1}]
        assert _get(url + "api/steps")[1] == info["steps"]

        status, rows = _get(url + "api/steps/1")
        assert status == 200 and len(rows) == 2
        # |gap| over the trained tokens only: 0.25 and 0.5.
        assert rows[0]["gap"] == {"max": 0.5, "mean": 0.375}
        assert rows[0]["tokens"] == TOKEN_ROW["tokens"] and rows[1]["reward"] == 0.0
        status, old_rows = _get(url + "api/steps/2")
        assert status == 200 and old_rows == [OLD_ROW]  # text-only rows pass through, no gap

        status, metrics = _get(url + "api/metrics")
        assert status == 200
        assert metrics["train/reward"] == [[1, 0.5], [2, 0.75]]
        assert metrics["validation/accuracy"] == [[0, 0.25]]
        assert metrics["monitor/entropy_collapse"] == [[2, 1.0]]
        assert "note" not in metrics

        status, page = _get(url)
        assert status == 200 and '<script src="app.js">' in page
        for name in ("app.js", "plots.js", "style.css"):
            status, text = _get(url + name)
            assert status == 200 and len(text) > 500, name

        assert _get(url + "api/steps/7") == (422, {"error": f"no samples for step 7 in {run.run_dir}"})
        assert _get(url + "api/nope")[0] == 404
        assert _get(url + "secret.txt")[0] == 404


def test_a_line_being_written_is_skipped_and_a_malformed_line_is_named(log_dir: Path) -> None:
    run = find_run(log_dir / "exp_2")
    assert run.run_dir == (log_dir / "exp_2").resolve()
    samples = run.run_dir / "train_data_step1.jsonl"
    with samples.open("a") as f:
        f.write('{"prompt": "still bei')  # the run is writing this line now
    assert len(run.rows(1)) == 2
    samples.write_text(json.dumps(TOKEN_ROW) + "\n[1, 2]\n")
    with serving_in_background(run) as server:
        status, payload = _get(server.url + "api/steps/1")
    assert status == 422
    assert payload == {"error": f"{samples}:2: not a JSON object (a list)"}


def test_bad_log_dirs_are_named(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match=r"log dir .*missing does not exist"):
        find_run(tmp_path / "missing")
    (tmp_path / "exp_1").mkdir()
    with pytest.raises(UserInputError, match=r"no metrics.jsonl or train_data_step\*.jsonl in .* \(1 exp_N folders"):
        find_run(tmp_path)


def test_a_taken_port_is_named(log_dir: Path) -> None:
    with serving_in_background(find_run(log_dir)) as server:
        port = server.server_address[1]
        with pytest.raises(UserInputError, match=rf"^cannot serve on 127.0.0.1:{port}: "):
            ViewerServer(find_run(log_dir), "127.0.0.1", port)


def _viewer(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(REPO / "examples" / "view_rollouts.py"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_command_line_serves_until_ctrl_c(log_dir: Path) -> None:
    proc = _viewer(str(log_dir), "--port", "0")
    assert proc.stdout is not None
    note = proc.stdout.readline()
    line = proc.stdout.readline()
    assert "exp_2" in note and line.startswith("rollout viewer: http://127.0.0.1:"), (note, line)
    url = line.split()[2]
    assert _get(url + "api/steps")[1] == [{"step": 1, "samples": 2}, {"step": 2, "samples": 1}]
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out.strip() == "stopped" and "Traceback" not in err


def test_command_line_refuses_a_missing_log_dir(tmp_path: Path) -> None:
    proc = _viewer(str(tmp_path / "nowhere"))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.strip().splitlines() == [
        f"error: log dir {tmp_path / 'nowhere'} does not exist (give a run's exp_N folder or the folder holding them)"
    ]
