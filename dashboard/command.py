"""`kvobs dashboard`: the Streamlit dashboard over the store.

kvobs dashboard --store sqlite:///kvobs.db --jaeger-url http://localhost:16686 --port 8501
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from kvobs.addresses import port
from kvobs.commands.common import add_store_flag, lacks_extra, refuse_ports_in_use, start_or_report
from kvobs.semconv.endpoints import DASHBOARD_PORT


def add_parser(sub) -> None:
    p = sub.add_parser("dashboard", help="serve the Streamlit dashboard over the store")
    add_store_flag(p)
    p.add_argument("--jaeger-url", help="Jaeger UI base URL: each agent step links to its trace there")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a container)")
    p.add_argument("--port", type=port, default=DASHBOARD_PORT, help="port the dashboard listens on")
    p.set_defaults(func=run)


def command(args: argparse.Namespace) -> list[str]:
    spec = importlib.util.find_spec("dashboard.app")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the dashboard package is not installed")
    app = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(Path(spec.origin)),
        "--server.address",
        args.host,
        "--server.port",
        str(args.port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "minimal",  # no "Deploy" button: this dashboard is served, not published to Streamlit's cloud
        "--",
    ]
    if args.store:
        app += ["--store", args.store]
    if args.jaeger_url:
        app += ["--jaeger-url", args.jaeger_url]
    return app


def run(args: argparse.Namespace) -> int:
    """Check the store, then replace this process with `streamlit run` (never returns when it starts)."""
    if lacks_extra("dashboard", "dashboard", "streamlit", find_only=True):
        return 2
    from kvobs.store import open_store

    def check():
        refuse_ports_in_use([("--port", args.host, args.port)], "another dashboard? stop it or pass another --port")
        # a SQLite file that is not there is a misspelt URL, not a new store
        return open_store(args.store, must_exist=True)

    store = start_or_report("dashboard", check)  # fail here, in one line, not after Streamlit printed its URL
    if store is None:
        return 2
    store.close()
    print(f"kvobs dashboard on http://{args.host}:{args.port}", file=sys.stderr)
    sys.stderr.flush()
    app = command(args)
    # Become Streamlit (no child left behind): SIGTERM from `docker stop` or `kvobs demo` reaches it directly.
    os.execv(app[0], app)
