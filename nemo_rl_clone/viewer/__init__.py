"""The rollout viewer: a local web page over a run's sample JSONL and metrics (docs/rollout_viewer.md).

`run_logs` reads the logs, `server` serves the page (``static/``) and its JSON endpoints with the standard
library's ``http.server``, `chromium` drives a headless Chromium for screenshots and the browser test.
"""
