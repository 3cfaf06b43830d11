"""docker-compose.yml stays equivalent to the local stack: Kafka 3.9 KRaft, Redis 8, one service
per worker role, Prometheus. `docker compose config` validates it where the client has compose."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from workers.roles import ROLE_TOPICS

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"


def test_compose_has_the_stack_and_one_service_per_role():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert services["kafka"]["image"].startswith("apache/kafka:3.9")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert services["redis"]["image"].startswith("redis:8")
    assert services["prometheus"]["image"].startswith("prom/prometheus")
    for role in [*ROLE_TOPICS, "query"]:
        assert services[role]["command"] == ["memstream", "worker", "--role", role]
        assert services[role]["environment"]["MEMSTREAM_KAFKA_BOOTSTRAP"] == "kafka:9092"
    assert services["topics"]["command"] == ["memstream", "topics", "create"]
    assert (ROOT / "ops" / "prometheus.yml").exists()


def _has_compose() -> bool:
    docker = shutil.which("docker")
    return bool(docker) and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _has_compose(), reason="docker client with the compose plugin not installed")
def test_docker_compose_config_validates():
    proc = subprocess.run(["docker", "compose", "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
