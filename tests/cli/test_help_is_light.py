"""`kvobs --help` builds every command's parser without importing what the commands run (the issue asked for under
1 s; it took 2.9 s when building the parsers imported SQLAlchemy and Alembic). Checked by what is imported, not by a
timing: a module that pulls a heavy library at import time fails this test on any machine."""

from __future__ import annotations

import subprocess
import sys

HEAVY = {
    "sqlalchemy",
    "alembic",
    "torch",
    "streamlit",
    "pandas",
    "numpy",
    "grpc",
    "zmq",
    "fastapi",
    "uvicorn",
    "opentelemetry",
    "chdb",
    "clickhouse_connect",
}


def test_building_every_parser_imports_no_heavy_library():
    code = (
        "import sys, kvobs.cli; kvobs.cli.build_parser(); "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(HEAVY)!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"imported at --help: {done.stdout.strip()}"


def test_the_dashboard_runs_streamlit_without_its_deploy_button():
    from dashboard.command import command
    from kvobs.cli import build_parser

    argv = command(build_parser().parse_args(["dashboard", "--port", "8599"]))
    at = argv.index("--client.toolbarMode")
    assert argv[at + 1] == "minimal" and argv.index("--") > at
