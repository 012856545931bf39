"""Console progress of a training run: a rich progress bar over steps whose label names the phase running now.

    with StepProgress("GRPO", total_steps=40, start_step=0):
        phase(1, "generation")      # logs "step 1: generation" and relabels the bar
        ...
        advance(1)                  # step 1 done

`phase` and `advance` act on the innermost active bar (validation helpers call `phase` without holding the bar);
with no active bar `phase` still logs its line. On a terminal the bar stays at the bottom while logs scroll above
it; in a log file (not a terminal) only the phase lines appear, plus the bar once when the run ends.
"""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from nemo_rl_clone.utils import signals, watchdog

console = Console()
_active: list[StepProgress] = []


class StepProgress:
    """A progress bar from ``start_step`` to ``total_steps`` (a resumed run starts part-way)."""

    def __init__(self, title: str, total_steps: int, start_step: int = 0) -> None:
        self.title = title
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            redirect_stdout=True,
            redirect_stderr=True,
        )
        self.task = self.progress.add_task(title, total=total_steps, completed=start_step)

    def __enter__(self) -> StepProgress:
        self.progress.start()
        _active.append(self)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        _active.remove(self)
        self.progress.stop()

    def set_phase(self, step: int, name: str) -> None:
        self.progress.update(self.task, description=f"{self.title} step {step}: {name}")

    def set_completed(self, step: int) -> None:
        self.progress.update(self.task, completed=step, description=f"{self.title} step {step}: done")


def phase(step: int, name: str) -> None:
    """Log that ``step`` entered phase ``name`` and show it on the active bar; a pending SIGTERM stops the run here
    (`signals.at_phase` raises `signals.StopRequested`)."""
    signals.at_phase(step, name)
    watchdog.at_phase(step, name)
    console.log(f"step {step}: {name}", _stack_offset=2)  # name the caller, not this module
    if _active:
        _active[-1].set_phase(step, name)


def advance(step: int) -> None:
    """Mark ``step`` finished on the active bar."""
    watchdog.at_step_end()
    if _active:
        _active[-1].set_completed(step)
