"""The rollout viewer's HTTP server (standard library only): the page's static files and JSON endpoints.

Endpoints (all GET, JSON):

- ``/api/run``: ``{"run_dir", "note", "steps": [{"step", "samples"}]}``
- ``/api/steps``: the ``steps`` list alone
- ``/api/steps/<N>``: the sample rows of step N (`RunLogs.rows`)
- ``/api/metrics``: metric name → ``[[step, value], ...]``

A problem with the logs (a malformed line) is answered with status 422 and ``{"error": "..."}``, which the page
shows; an unknown path gets 404.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.viewer.run_logs import RunLogs

STATIC_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/plots.js": ("plots.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}


class ViewerServer(ThreadingHTTPServer):
    daemon_threads = True  # Ctrl-C does not wait for a browser's open connections

    def __init__(self, run: RunLogs, host: str, port: int) -> None:
        self.run = run
        try:
            super().__init__((host, port), _Handler)
        except OSError as error:  # port taken, unknown host: the user's choice
            raise UserInputError(f"cannot serve on {host}:{port}: {error.strerror or error}") from None

    @property
    def url(self) -> str:
        host, port = str(self.server_address[0]), self.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"


@contextmanager
def serving_in_background(run: RunLogs, host: str = "127.0.0.1", port: int = 0) -> Iterator[ViewerServer]:
    """A `ViewerServer` answering from a background thread until the block ends (tests, screenshots)."""
    server = ViewerServer(run, host, port)
    thread = threading.Thread(target=server.serve_forever, name="rollout-viewer", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class _Handler(BaseHTTPRequestHandler):
    server: ViewerServer

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in STATIC_FILES:
            name, content_type = STATIC_FILES[path]
            body = resources.files("nemo_rl_clone.viewer").joinpath("static", name).read_bytes()
            self._send(HTTPStatus.OK, body, content_type)
            return
        if not path.startswith("/api/"):
            self._send_json(HTTPStatus.NOT_FOUND, {"error": f"no such page: {path}"})
            return
        try:
            found, payload = self._api(path[len("/api/") :].strip("/"))
        except UserInputError as error:
            self._send_json(HTTPStatus.UNPROCESSABLE_ENTITY, {"error": str(error)})
            return
        if not found:
            self._send_json(HTTPStatus.NOT_FOUND, {"error": f"no such endpoint: {path}"})
            return
        self._send_json(HTTPStatus.OK, payload)

    def _api(self, route: str) -> tuple[bool, Any]:
        run = self.server.run
        if route == "run":
            return True, {"run_dir": str(run.run_dir), "note": run.note, "steps": run.steps()}
        if route == "steps":
            return True, run.steps()
        if route == "metrics":
            return True, run.metrics()
        head, _, step = route.partition("/")
        if head == "steps" and step.isdigit():
            return True, run.rows(int(step))
        return False, None

    def _send_json(self, status: HTTPStatus, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")  # the run may still be writing: always fresh
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would bury the URL the user needs
