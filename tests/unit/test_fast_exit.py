"""`skip_final_garbage_collection`: the entry points' front door registers `gc.freeze` once, and it runs after every
other exit handler (Ray's shutdown, logging's flush), so that it only spares the collector's last sweep."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SFT_SMOKE = Path(__file__).resolve().parents[2] / "configs" / "sft_smoke.yaml"

PROBE = """
import atexit, gc
gc.freeze = lambda: print("freeze", flush=True)  # observe the call (atexit keeps the function it was given)
from nemo_rl_clone.utils import fast_exit
fast_exit.skip_final_garbage_collection()
fast_exit.skip_final_garbage_collection()  # a second call registers nothing more
atexit.register(lambda: print("a handler registered later", flush=True))
"""


def test_freeze_is_registered_once_and_runs_last() -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["a handler registered later", "freeze"]


def test_the_front_door_registers_it() -> None:
    probe = (
        "import atexit, gc; gc.freeze = lambda: print('freeze', flush=True)\n"
        "from nemo_rl_clone.utils.config import load_run_from_cli\n"
        "from nemo_rl_clone.algorithms.sft.config import SFTMasterConfig\n"
        f"load_run_from_cli(SFTMasterConfig, {str(SFT_SMOKE)!r}, [])\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "freeze"
