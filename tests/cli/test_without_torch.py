"""A collector-only install: `kvobs` with torch impossible to import. Every command is listed, `kvobs collect` runs
and stops cleanly, and `kvobs serve` says which extra to install, in one line."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from importlib.metadata import entry_points

import pytest

from tests.server.conftest import free_port

NO_TORCH = "import sys; sys.modules['torch'] = None; from kvobs.cli import main; sys.exit(main(sys.argv[1:]))"


def kvobs(*args: str) -> list[str]:
    return [sys.executable, "-c", NO_TORCH, *args]


def test_help_lists_every_registered_command_without_torch():
    done = subprocess.run(kvobs("--help"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    names = {ep.name for ep in entry_points(group="kvobs.commands")}
    assert names == {
        "demo",
        "agents",
        "alerts",
        "doctor",
        "export",
        "serve",
        "generate",
        "whatif",
        "report",
        "collect",
        "import",
        "dashboard",
    }
    assert all(name in done.stdout for name in names) and "cannot be loaded" not in done.stderr


@pytest.mark.parametrize(("command", "extra"), [("serve", "server"), ("generate", "engine")])
def test_engine_commands_without_torch_name_the_extra_to_install(command, extra):
    done = subprocess.run(
        kvobs(command, "--port", str(free_port())) if command == "serve" else kvobs(command, "hi"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.startswith(f"kvobs {command} needs the {extra} extra: pip install 'kvobs[{extra}]' (")
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_import_runs_without_torch(tmp_path):
    """A capture replayed into the store by the collector's parts: a collector-only install can do it."""
    from tests.collectors.fleet_recording import VLLM_FLEET

    url = f"sqlite:///{tmp_path / 'kvobs.db'}"
    done = subprocess.run(kvobs("import", str(VLLM_FLEET), "--store", url), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "27 OTLP exports" in done.stdout


def test_collect_runs_without_torch(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        kvobs("collect", "--otlp-http", f"127.0.0.1:{port}", "--store", f"sqlite:///{tmp_path / 'kvobs.db'}"),
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    try:
        for line in proc.stderr:  # until the collector says it is collecting (or exits)
            lines.append(line)
            if "collecting into" in line:
                break
        assert proc.poll() is None, "".join(lines)
        time.sleep(0.5)  # past the signal handlers' installation
    finally:
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=60)
    stderr = "".join(lines) + rest
    assert proc.returncode == 0, stderr
    assert "torch" not in stderr and "stopping" in stderr
