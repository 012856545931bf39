"""Reading one run's logs for the rollout viewer: its ``metrics.jsonl`` and the per-step sample JSONL.

Files are read on every request, so the page follows a run that is still writing them. A line still being written
(the file's last line, without its newline) is left out until it is complete; any other line that is not a JSON
object is an error naming the file and line.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_rl_clone.utils.errors import UserInputError

METRICS_FILE = "metrics.jsonl"
SAMPLES_PATTERN = re.compile(r"train_data_step(\d+)\.jsonl")
_RUN_DIR_PATTERN = re.compile(r"exp_(\d+)")


@dataclass(frozen=True)
class RunLogs:
    """The log directory of one run (``exp_N``); ``note`` says how it was chosen."""

    run_dir: Path
    note: str

    def sample_files(self) -> dict[int, Path]:
        """Step → its sample file, in step order."""
        found = {}
        for path in self.run_dir.iterdir():
            match = SAMPLES_PATTERN.fullmatch(path.name)
            if match:
                found[int(match.group(1))] = path
        return dict(sorted(found.items()))

    def steps(self) -> list[dict[str, Any]]:
        """``[{"step", "samples"}]`` for every step with a sample file."""
        return [{"step": step, "samples": len(read_jsonl(path))} for step, path in self.sample_files().items()]

    def rows(self, step: int) -> list[dict[str, Any]]:
        """The sample rows of ``step`` with ``gap`` added where the trainer's logprobs are there (`logprob_gap`)."""
        path = self.sample_files().get(step)
        if path is None:
            raise UserInputError(f"no samples for step {step} in {self.run_dir}")
        rows = read_jsonl(path)
        for row in rows:
            gap = logprob_gap(row)
            if gap is not None:
                row["gap"] = gap
        return rows

    def metrics(self) -> dict[str, list[list[float]]]:
        """Metric name → ``[[step, value], ...]`` in file order (numbers only; NaN and infinities left out)."""
        path = self.run_dir / METRICS_FILE
        series: dict[str, list[list[float]]] = {}
        if not path.is_file():
            return series
        for record in read_jsonl(path):
            step = record.get("step")
            if not isinstance(step, int):
                continue
            for name, value in record.items():
                if name != "step" and _is_number(value) and math.isfinite(value):
                    series.setdefault(name, []).append([step, value])
        return series


def logprob_gap(row: dict[str, Any]) -> dict[str, float] | None:
    """``{"max", "mean"}`` of |trainer − generation logprob| over the tokens the loss trains on (all tokens when the
    row has no loss mask), or None when the row has no trainer logprobs."""
    trainer, engine = row.get("trainer_logprobs"), row.get("generation_logprobs")
    if not trainer or not engine or len(trainer) != len(engine):
        return None
    mask = row.get("loss_mask") or [1] * len(trainer)
    gaps = [abs(t - g) for t, g, m in zip(trainer, engine, mask, strict=False) if m]
    if not gaps:
        return {"max": 0.0, "mean": 0.0}
    return {"max": round(max(gaps), 4), "mean": round(sum(gaps) / len(gaps), 4)}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of ``path``, one per line; an incomplete last line (being written) is left out."""
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    if lines and not text.endswith("\n"):
        lines = lines[:-1]
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise UserInputError(f"{path}:{number}: not a JSON object ({error.msg})") from None
        if not isinstance(record, dict):
            raise UserInputError(f"{path}:{number}: not a JSON object (a {type(record).__name__})")
        records.append(record)
    return records


def find_run(path: str | Path) -> RunLogs:
    """The run to show: ``path`` itself when it holds logs, else its latest ``exp_N`` that does.

    Raises `UserInputError` when ``path`` does not exist or no run there has a metrics or sample file.
    """
    base = Path(path).expanduser()
    if not base.is_dir():
        raise UserInputError(f"log dir {path} does not exist (give a run's exp_N folder or the folder holding them)")
    if _has_logs(base):
        return RunLogs(base.resolve(), f"showing {base.resolve()}")
    runs = sorted(
        (int(m.group(1)), child)
        for child in base.iterdir()
        if (m := _RUN_DIR_PATTERN.fullmatch(child.name)) and child.is_dir()
    )
    with_logs = [child for _, child in runs if _has_logs(child)]
    if not with_logs:
        raise UserInputError(
            f"no {METRICS_FILE} or train_data_step*.jsonl in {path} or in an exp_N folder under it "
            f"({len(runs)} exp_N folders found)"
        )
    latest = with_logs[-1].resolve()
    return RunLogs(latest, f"showing {latest.name}, the latest of the {len(runs)} exp_N folders in {base.resolve()}")


def _has_logs(folder: Path) -> bool:
    return (folder / METRICS_FILE).is_file() or any(SAMPLES_PATTERN.fullmatch(p.name) for p in folder.iterdir())


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
