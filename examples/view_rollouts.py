"""A local web page over a run's samples and metrics (docs/rollout_viewer.md).

    uv run examples/view_rollouts.py <log dir> [--port 0] [--host 127.0.0.1]
    uv run examples/view_rollouts.py <log dir> --screenshot docs/rollout_viewer.png [--step N]

``<log dir>`` is a run's ``exp_N`` folder or the folder holding them (the latest run with logs is shown). Serves
until Ctrl-C; with ``--screenshot`` it takes a headless-Chromium screenshot of the page instead and exits. A log dir
that does not exist or holds no logs: one ``error:`` line and exit code 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from nemo_rl_clone.utils.errors import reporting_user_errors
from nemo_rl_clone.viewer.chromium import screenshot
from nemo_rl_clone.viewer.run_logs import find_run
from nemo_rl_clone.viewer.server import ViewerServer, serving_in_background


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("log_dir", help="a run's exp_N folder, or the folder holding exp_* (the latest is shown)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    parser.add_argument("--port", type=int, default=0, help="port (default 0: any free port; the URL is printed)")
    parser.add_argument("--screenshot", type=Path, metavar="PNG", help="write a screenshot of the page and exit")
    parser.add_argument("--step", type=int, help="with --screenshot: the step shown (default: the last)")
    parser.add_argument("--window-size", default="1400,1800", help="with --screenshot: WIDTH,HEIGHT in pixels")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with reporting_user_errors():
        run = find_run(args.log_dir)
        print(run.note, flush=True)
        if args.screenshot is not None:
            width, height = (int(n) for n in args.window_size.split(","))
            with serving_in_background(run, args.host, args.port) as server:
                query = f"?step={args.step}" if args.step is not None else ""
                path = screenshot(server.url + query, args.screenshot, (width, height))
            print(f"screenshot: {path}")
            return
        server = ViewerServer(run, args.host, args.port)
        print(f"rollout viewer: {server.url}  (Ctrl-C to stop)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            print("stopped")
        finally:
            server.server_close()


if __name__ == "__main__":
    main()
