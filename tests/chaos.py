"""A chaos driver for the indexing pipeline: one `memstream worker` process per role on a
private stack, disrupted on a seeded schedule (SIGKILL, SIGTERM, a joining extractor, a Redis
outage, a broker restart) with every action logged with its time; and the audits of what came
out: the events on indexed-facts, the dead letters, and a tenant's export modulo what
legitimately differs between two runs of one corpus."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from kafka import KafkaAdminClient

from ops.fake_llm import FakeOpenAI
from ops.stack.processes import WorkerProcess, stop_all
from ops.stack.services import Stack, free_ports

TERM_TIMEOUT_S = 60  # a graceful stop that takes longer is finished with SIGKILL (and logged)


def free_kafka_port(brokers: int = 1) -> int:
    """A free port followed by free ports for every broker and its controller (broker n listens
    on port + 2(n - 1), its controller on the next: ops.stack.services.Stack)."""
    return free_ports(2 * brokers)


def leading_broker(bootstrap: str, namespace: str) -> int:
    """The id of the broker that leads most partitions of the pipeline's topics (from 1), once
    each is replicated on every broker."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        described = admin.describe_topics([t for t in admin.list_topics() if t.startswith(f"{namespace}.")])
    finally:
        admin.close()
    partitions = [p for topic in described for p in topic["partitions"]]
    brokers = len(bootstrap.split(","))
    if not partitions or any(len(p["replica_nodes"]) != brokers for p in partitions):
        replicas = {t["name"]: sorted({len(p["replica_nodes"]) for p in t["partitions"]}) for t in described}
        raise AssertionError(f"the pipeline's topics are not replicated on all {brokers} brokers: {replicas}")
    return Counter(p["leader_id"] for p in partitions).most_common(1)[0][0]


class ActionLog:
    """Timestamped lines, to a file and kept in memory for the summary."""

    def __init__(self, path: Path):
        self.path = path
        self.started = time.monotonic()
        self.lines: list[str] = []

    def __call__(self, message: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} +{time.monotonic() - self.started:7.2f}s {message}"
        self.lines.append(line)
        with open(self.path, "a") as out:
            out.write(line + "\n")


@dataclass
class Worker:
    name: str
    role: str
    process: WorkerProcess
    stopping: bool = False  # signalled by the driver: its exit is no crash

    @property
    def log(self) -> Path:
        return self.process.log

    def ready(self) -> bool:
        """faust logged that it is up (at log level info): it may hold partitions and work."""
        try:
            return b"[^Worker]: Ready" in self.log.read_bytes()
        except OSError:
            return False


@dataclass
class Fleet:
    """`memstream worker --role R` processes sharing one environment (topics, group, stack)."""

    env: dict
    logs: Path
    cwd: Path
    say: ActionLog
    workers: list[Worker] = field(default_factory=list)
    started: int = 0
    crashes: int = 0

    def start(self, role: str) -> Worker:
        self.started += 1
        name = f"{role}-{self.started}"
        worker = Worker(
            name,
            role,
            WorkerProcess.spawn(self.logs / f"{name}.log", self.env, role=role, cwd=self.cwd, own_session=True),
        )
        self.workers.append(worker)
        return worker

    def running(self, role: str | None = None) -> list[Worker]:
        return [w for w in self.workers if w.process.running() and not w.stopping and role in (None, w.role)]

    def stop(self, worker: Worker, sig: int) -> str:
        """SIGKILL goes to the process group at once; SIGTERM to the process, as compose,
        systemd and Kubernetes send it, then waits for it to exit. Returns how it ended."""
        worker.stopping = True
        if sig == signal.SIGKILL:
            worker.process.kill()
            return "killed"
        started = time.monotonic()
        if worker.process.stop(TERM_TIMEOUT_S):
            return f"exited {worker.process.returncode} after {time.monotonic() - started:.1f}s"
        return f"still running {TERM_TIMEOUT_S}s after SIGTERM: killed"

    def supervise(self) -> None:
        """Restart a worker that exited by itself, as a process supervisor would."""
        for worker in list(self.workers):
            if not worker.stopping and not worker.process.running():
                worker.stopping = True
                self.crashes += 1
                replacement = self.start(worker.role)
                self.say(
                    f"CRASH {worker.name} exited by itself with {worker.process.returncode} (see {worker.log}); restarted as {replacement.name}"
                )

    def stop_all(self) -> None:
        for worker in self.running():
            worker.stopping = True
        stop_all(w.process for w in self.workers)


@dataclass(frozen=True)
class Action:
    kind: str  # kill | term | join | redis | kafka
    role: str = ""  # kill and term: the victim's role


def plan(rng: random.Random, kills: int = 3, terms: int = 3, brokers: int = 1) -> list[Action]:
    """An extractor, which holds an LLM call in flight, gets one SIGKILL and one SIGTERM; the
    other signals go to the other roles in turn, in a seeded order; with one extractor joining,
    one Redis outage and one restart of every broker — and with several brokers, a SIGKILL of
    the one leading most partitions — all shuffled."""
    if kills < 1 or terms < 1:
        raise ValueError("the plan needs at least one SIGKILL and one SIGTERM")
    others = ["chunker", "detector", "resolver", "query"]
    signals = ["kill"] * (kills - 1) + ["term"] * (terms - 1)
    rng.shuffle(signals)
    actions = [Action("kill", "extractor"), Action("term", "extractor")]
    actions += [Action(sig, others[i % len(others)]) for i, sig in enumerate(signals)]
    actions += [Action("join", "extractor"), Action("redis"), Action("kafka")]
    if brokers > 1:
        actions.append(Action("broker"))
    rng.shuffle(actions)
    return actions


@dataclass
class Chaos:
    fleet: Fleet
    stack: Stack
    rng: random.Random
    say: ActionLog
    redis_outage_s: float = 20.0
    llm: FakeOpenAI | None = None  # the extractors' LLM: slowed down before an extractor is signalled
    slow_call_s: float = 8.0
    broker_outage_s: float = 15.0  # how long a killed broker stays down
    counts: dict = field(default_factory=lambda: defaultdict(int))

    def run(self, action: Action) -> None:
        if action.kind in ("kill", "term"):
            # a worker that is up, so the signal lands on work in flight rather than on a start
            candidates = sorted(self.fleet.running(action.role), key=lambda w: w.name)
            ready = [w for w in candidates if w.ready()]
            victim = self.rng.choice(ready or candidates)
            sig = signal.SIGKILL if action.kind == "kill" else signal.SIGTERM
            normal_latency = self.llm.latency_s if self.llm else 0.0
            if action.role == "extractor" and self.llm is not None:
                self._slow_calls_in_flight(len(ready))
            self.say(
                f"{sig.name} {victim.name} (pid {victim.process.pid}{'' if victim.ready() else ', still starting'})"
            )
            ended = self.fleet.stop(victim, sig)
            if self.llm is not None:
                self.llm.latency_s = normal_latency
            replacement = self.fleet.start(victim.role)
            self.counts[action.kind] += 1
            self.counts["restarts"] += 1
            self.say(f"  {victim.name} {ended}; restarted as {replacement.name} (pid {replacement.process.pid})")
        elif action.kind == "join":
            joined = self.fleet.start(action.role)
            self.counts["joins"] += 1
            self.say(f"REBALANCE {joined.name} (pid {joined.process.pid}) joins the group")
        elif action.kind == "redis":
            self.say("REDIS stop")
            self.stack.service_down("redis")
            self.say(f"  redis down; waiting {self.redis_outage_s:g}s")
            time.sleep(self.redis_outage_s)
            self.stack.service_up("redis", progress=lambda m: None)
            self.counts["redis_outages"] += 1
            self.say("  redis up again (same data directory, AOF)")
        elif action.kind == "broker":
            leader = leading_broker(self.stack.bootstrap, self.fleet.env["MEMSTREAM_TOPIC_NAMESPACE"])
            victim = self.stack.brokers[leader - 1]
            self.say(f"BROKER SIGKILL {victim.name} (broker {leader}, the leader of most partitions)")
            os.killpg(victim.pid(), signal.SIGKILL)  # no clean shutdown: its partitions elect new leaders
            time.sleep(self.broker_outage_s)
            self.stack.service_up("kafka", progress=lambda m: None)  # only the killed one is down
            self.counts["broker_kills"] += 1
            self.say(f"  {victim.name} up again after {self.broker_outage_s:g}s")
        elif action.kind == "kafka":
            self.say("KAFKA stop")
            self.stack.service_down("kafka")
            self.say("  kafka down; starting it again")
            self.stack.service_up("kafka", progress=lambda m: None)
            self.counts["kafka_restarts"] += 1
            self.say("  kafka up again")
        else:
            raise ValueError(f"unknown chaos action {action.kind!r}")

    def _slow_calls_in_flight(self, extractors: int) -> None:
        """Make the next LLM calls slow and wait until each ready extractor has started one (an
        extractor makes one call at a time), so the signal lands mid-call with seconds to go:
        a stop that cancels the call must not lose or commit its chunk."""
        self.llm.latency_s, before = self.slow_call_s, self.llm.calls
        deadline = time.monotonic() + 2 * self.slow_call_s
        while self.llm.calls - before < extractors and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(min(1.0, self.slow_call_s / 4))
        self.say(
            f"  {self.llm.calls - before} slow LLM calls ({self.slow_call_s:g}s) started for {extractors} ready extractors, {self.llm.in_flight} in flight"
        )


def unindexed(settings, documents, deleted: list[str] = ()) -> list[str]:
    """Ids of the documents (this text) not yet fully indexed, and of the `deleted` ones (of the
    documents' tenant) not yet out, in one pass over their status."""
    import asyncio

    from ops.publish import unindexed as unindexed_of
    from store import Memory
    from workers.algorithms.normalize import content_hash

    async def check() -> list[str]:
        memory = Memory.from_url(settings.redis_url)
        try:
            wanted = {(doc.tenant, doc.doc_id): content_hash(doc.text) for doc in documents}
            wanted.update({(documents[0].tenant, doc_id): "" for doc_id in deleted})
            left = await unindexed_of(memory, wanted)
            return [key[1] for key in wanted if key in left]
        finally:
            await memory.close()

    return asyncio.run(check())


def wait_indexed(settings, documents, fleet: Fleet, timeout_s: float, deleted: list[str] = ()) -> list[str]:
    """Until every document is indexed (and every `deleted` one out) or the timeout, restarting
    crashed workers meanwhile. Returns the ids still pending."""
    deadline = time.monotonic() + timeout_s
    while True:
        fleet.supervise()
        pending = unindexed(settings, documents, deleted)
        if not pending or time.monotonic() > deadline:
            return pending
        time.sleep(1.0)


# ---- audits ----------------------------------------------------------------------------------
def read_topic(bootstrap: str, topic: str) -> list:
    """Every record of a topic, from the beginning to the end offsets read at the start."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        if not partitions:
            return []
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        records, deadline = [], time.monotonic() + 120
        while any(consumer.position(p) < ends[p] for p in partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: could not read up to the end offsets {ends}")
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
        return records
    finally:
        consumer.close()


# What a re-published outbox may not change, but a second decision of the same transition does.
DECISION_TIME_FIELDS = ("ts", "graph_version")


@dataclass
class EventAudit:
    events: int = 0
    redeliveries: int = 0  # the same event id with byte-identical content: an outbox sent again
    decided_twice: list = field(default_factory=list)  # same id, differing only in DECISION_TIME_FIELDS
    conflicting: list = field(default_factory=list)  # same id, different content

    @property
    def problems(self) -> list[str]:
        return self.decided_twice + self.conflicting


def audit_events(values: list[bytes]) -> dict[str, EventAudit]:
    """Per tenant: every event id must stand for one content. A byte-identical copy is an
    allowed redelivery; anything else under one id is a failure, split into 'decided twice'
    (the same transition decided again: only its time and graph version differ) and
    'conflicting' (different content)."""
    by_id: dict[tuple[str, str], list[bytes]] = defaultdict(list)
    audits: dict[str, EventAudit] = defaultdict(EventAudit)
    for value in values:
        event = json.loads(value)
        audits[event["tenant"]].events += 1
        by_id[(event["tenant"], event["event_id"])].append(value)
    for (tenant, event_id), copies in by_id.items():
        audit = audits[tenant]
        distinct = list(dict.fromkeys(copies))
        audit.redeliveries += len(copies) - len(distinct)
        if len(distinct) == 1:
            continue
        decoded = [json.loads(v) for v in distinct]
        content = {
            json.dumps({k: v for k, v in e.items() if k not in DECISION_TIME_FIELDS}, sort_keys=True) for e in decoded
        }
        first = decoded[0]
        summary = f"event id {event_id} ({first['event']} of fact {first['fact_id']}) published {len(copies)}x"
        if len(content) == 1:
            audit.decided_twice.append(
                f"{summary}, decided {len(distinct)}x (graph versions {[e.get('graph_version') for e in decoded]})"
            )
        else:
            diff = sorted({k for e in decoded for k in e if k not in DECISION_TIME_FIELDS and e.get(k) != first.get(k)})
            audit.conflicting.append(
                f"{summary} with {len(distinct)} different contents (fields differing: {', '.join(diff)})"
            )
    return dict(audits)


# Fact fields that are system time: when a fact was first extracted, activated or retired. Two
# runs differ in their values; whether each is set is compared (an active fact has no
# expired_at, a pending one no activated_at).
SYSTEM_TIME_FIELDS = ("created_at", "activated_at", "expired_at")


def comparable_export(memory: dict) -> dict:
    """A `memstream export` modulo what legitimately differs between two runs of one corpus:
    - tenant: the runs' tenants differ;
    - graph_version: counts bumps, and a redelivered message may bump again (versions may
      skip, never go back);
    - SYSTEM_TIME_FIELDS: only whether each is set;
    - reason: the text records the decision's history (the trigger, the support counts when the
      fact's status last changed), not the end state; status and qualifiers are compared;
    - edge weights to 3 decimals: a similarity edge's cosine is computed from whichever entity
      arrived second, in float32.
    Everything else — schemas and their frequencies, every fact's status, provenance,
    qualifiers, world-time fields and merge target, entities, edges — must be equal."""
    facts = []
    for fact in memory["facts"]:
        kept = {k: v for k, v in fact.items() if k not in SYSTEM_TIME_FIELDS and k != "reason"}
        kept.update({f"{k} set": bool(fact.get(k)) for k in SYSTEM_TIME_FIELDS})
        kept["passages"] = sorted(fact.get("passages") or [])
        facts.append(kept)
    return {
        "schemas": sorted(memory["schemas"], key=lambda s: s["id"]),
        "facts": sorted(facts, key=lambda f: f["id"]),
        "entities": sorted(memory["entities"], key=lambda e: e["id"]),
        "edges": sorted(
            ({**e, "weight": round(e["weight"], 3)} for e in memory["edges"]),
            key=lambda e: (e["source"], e["target"], e["kind"]),
        ),
    }


def export_differences(expected: dict, actual: dict, limit: int = 12) -> list[str]:
    """What differs between two comparable exports, per record id (at most `limit` lines per
    section)."""
    lines = []
    for section, key in (("schemas", "id"), ("facts", "id"), ("entities", "id"), ("edges", None)):

        def ident(record, key=key):
            return record[key] if key else f"{record['source']} -{record['kind']}- {record['target']}"

        want = {ident(r): r for r in expected[section]}
        got = {ident(r): r for r in actual[section]}
        found = []
        for rid in sorted(set(want) | set(got)):
            a, b = want.get(rid), got.get(rid)
            if a == b:
                continue
            if a is None or b is None:
                found.append(f"{section} {rid}: {'missing' if b is None else 'extra'} ({a or b})")
            else:
                fields = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
                found.append(f"{section} {rid}: " + "; ".join(f"{k} {a.get(k)!r} → {b.get(k)!r}" for k in fields))
        if found:
            lines.append(f"{section}: {len(found)} differ")
            lines += [f"  {line}" for line in found[:limit]]
    return lines
