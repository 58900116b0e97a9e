"""docker-compose.yml, checked as far as this machine can without a Docker engine: `docker-compose config -q` (with
and without the vllm profile), then the resolved file: every kvobs command parses with the real `kvobs` parser,
every `depends_on: service_healthy` has a health check to wait for, every mounted file and every file the
Dockerfile copies exists, and the engine's cache holds a whole sequence."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from sqlalchemy import make_url

from kvobs.cli import build_parser
from kvobs.store.db import normalize_url
from tests.deploy.tools import REPO, needs

COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "deploy/Dockerfile"
SERVICES = {"clickhouse", "jaeger", "collector", "engine", "agents", "dashboard", "prometheus", "alertmanager"}
VLLM_PROFILE = {"vllm", "collector-vllm", "agents-vllm"}
OPTIONAL = VLLM_PROFILE | {"postgres"}


def _compose(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), *args], capture_output=True, text=True, timeout=120, cwd=REPO
    )


@pytest.fixture(scope="module")
def resolved() -> dict:
    done = _compose("--profile", "vllm", "--profile", "postgres", "config")
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


@needs("docker-compose", "docker-compose")
@pytest.mark.parametrize("profile", [[], ["--profile", "vllm"], ["--profile", "postgres"]])
def test_docker_compose_config_validates(profile):
    done = _compose(*profile, "config", "-q")
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr


@needs("docker-compose", "docker-compose")
def test_the_stack_has_every_service_and_the_vllm_ones_only_under_their_profile(resolved):
    services = resolved["services"]
    assert set(services) == SERVICES | OPTIONAL
    assert {name for name, s in services.items() if s.get("profiles")} == OPTIONAL
    assert services["jaeger"]["image"].startswith("jaegertracing/jaeger:2.")  # Jaeger v2 all-in-one
    assert services["clickhouse"]["image"].startswith("clickhouse/clickhouse-server:")
    assert {"kvobs-chdata", "kvobs-pgdata"} <= set(resolved["volumes"])


@needs("docker-compose", "docker-compose")
def test_every_kvobs_command_parses_with_the_kvobs_cli(resolved):
    parser = build_parser()
    kvobs = {name: s for name, s in resolved["services"].items() if s.get("image") == "kvobs:local"}
    assert set(kvobs) == {"collector", "engine", "agents", "dashboard", "collector-vllm", "agents-vllm"}
    for name, service in kvobs.items():
        argv = shlex.split(service["command"]) if isinstance(service["command"], str) else service["command"]
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{name}: `kvobs {' '.join(argv)}` does not parse")
        assert args.command == argv[0]
        if args.command == "agents":  # agents hold no store credentials: their spans carry the steps
            assert args.no_store and args.otlp_endpoint and "KVOBS_STORE_URL" not in service["environment"], name
            continue
        url = service["environment"]["KVOBS_STORE_URL"]
        assert url == "clickhouse://kvobs:kvobs@clickhouse:8123/kvobs", name  # the store: the clickhouse service
        assert normalize_url(url) and make_url(url).host in resolved["services"]
    engine = parser.parse_args(shlex.split(kvobs["engine"]["command"]))
    assert engine.num_blocks >= -(-engine.max_model_len // engine.block_size) + 1  # + the null block


@needs("docker-compose", "docker-compose")
def test_start_order_waits_only_on_health_checks_that_exist(resolved):
    services = resolved["services"]
    for name, service in services.items():
        for target, condition in (service.get("depends_on") or {}).items():
            assert target in services, (name, target)
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[target], f"{name} waits on {target}, which has no health check"
            if not service.get("profiles"):
                assert not services[target].get("profiles"), f"{name} depends on the optional {target}"
    assert services["agents"]["depends_on"]["engine"]["condition"] == "service_healthy"


@needs("docker-compose", "docker-compose")
def test_every_mounted_file_and_every_copied_path_exists(resolved):
    for service in resolved["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0] if isinstance(volume, str) else volume["source"]
            if source.startswith("/"):  # a bind mount, resolved to an absolute path; else a named volume
                assert Path(source).exists() and Path(source).is_relative_to(REPO), source
    copies = re.findall(r"^COPY\s+(.+)\s+\S+$", DOCKERFILE.read_text(), re.MULTILINE)
    assert copies
    for sources in copies:
        for source in sources.split():
            assert (REPO / source).exists(), source


def test_every_published_port_is_on_the_hosts_loopback_only():
    """The probe's F7: 5557/5558 carry prompt token ids and the admin endpoints change the cache; Docker publishes
    a bare "8000:8000" on every interface of the host."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    published = [(name, str(p)) for name, s in services.items() for p in s.get("ports", [])]
    assert published and all(p.startswith("127.0.0.1:") for _, p in published), published
    engine = services["engine"]
    assert "KVOBS_API_KEY" in engine["environment"]
