"""The step progress bar: phases relabel the innermost active bar, `advance` moves it, and resumed runs start part-way."""

from __future__ import annotations

import io

from rich.console import Console

from nemo_rl_clone.utils import progress


def _captured_console(monkeypatch) -> io.StringIO:
    out = io.StringIO()
    monkeypatch.setattr(progress, "console", Console(file=out, width=120, force_terminal=False))
    return out


def test_phases_relabel_the_bar_and_advance_moves_it(monkeypatch) -> None:
    out = _captured_console(monkeypatch)
    with progress.StepProgress("GRPO", total_steps=4, start_step=1) as bar:
        task = bar.progress.tasks[0]
        assert task.completed == 1  # resumed after step 1
        progress.phase(2, "generation")
        assert task.description == "GRPO step 2: generation"
        progress.advance(2)
        assert task.completed == 2
    assert "step 2: generation" in out.getvalue()
    assert "2/4" in out.getvalue()  # the final bar is printed once when the run ends


def test_phase_without_an_active_bar_only_logs(monkeypatch) -> None:
    out = _captured_console(monkeypatch)
    progress.phase(3, "validation")
    progress.advance(3)
    assert "step 3: validation" in out.getvalue()
