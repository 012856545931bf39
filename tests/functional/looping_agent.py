"""The agent of tests/functional/test_signals.py's Ctrl-C test: every episode sends long completions through the
run's server, one after another, so that requests are in flight whenever the run is interrupted."""

from __future__ import annotations

from typing import Any


async def run(client: Any, row: dict[str, Any]) -> float:
    model = (await client.models.list()).data[0].id
    while True:
        print("agent: request in flight", flush=True)  # Ray forwards it to the driver's output
        await client.completions.create(model=model, prompt="Count:", max_tokens=300, extra_body={"ignore_eos": True})
