"""Headless Chromium (Debian's ``chromium`` package) driving the viewer page: its DOM after the page's scripts ran,
and screenshots (``examples/view_rollouts.py --screenshot``, the functional test)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from nemo_rl_clone.utils.errors import UserInputError

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
# Virtual time the page gets to fetch its JSON and render before the DOM or screenshot is taken.
PAGE_BUDGET_MS = 10_000
TIMEOUT_S = 120


def find_chromium() -> str | None:
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


def _run_headless(url: str, *flags: str) -> str:
    chromium = find_chromium()
    if chromium is None:
        raise UserInputError("no chromium found: install it (Debian: `apt-get install -y chromium`)")
    with tempfile.TemporaryDirectory(prefix="rollout-viewer-chromium-") as profile:
        args = [
            chromium,
            "--headless",
            "--no-sandbox",  # root in containers and CI has no user namespace sandbox
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={profile}",  # never the user's profile, never a lock held by their browser
            f"--virtual-time-budget={PAGE_BUDGET_MS}",
            *flags,
            url,
        ]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed with exit code {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc.stdout


def dump_dom(url: str, window_size: tuple[int, int] = (1400, 1000)) -> str:
    """The page's DOM (serialised HTML) after its scripts ran."""
    return _run_headless(url, f"--window-size={window_size[0]},{window_size[1]}", "--dump-dom")


def screenshot(url: str, path: Path, window_size: tuple[int, int] = (1400, 1800)) -> Path:
    """A PNG of the page's first ``window_size`` pixels, written to ``path``."""
    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    _run_headless(url, f"--window-size={window_size[0]},{window_size[1]}", "--hide-scrollbars", f"--screenshot={path}")
    if not path.is_file():
        raise RuntimeError(f"chromium wrote no screenshot to {path}")
    return path
