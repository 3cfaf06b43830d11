"""The import graph of the package, read from the source: no cycle, counting imports inside
functions too (a function-level import that breaks a cycle only hides it), but not those under
TYPE_CHECKING; and the layers point one way — topics ← store ← workers ← ops."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("topics", "store", "workers", "ops")
LAYER = {name: n for n, name in enumerate(PACKAGES)}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module → the package's modules it imports (a name imported from a package counts as its
    submodule when it is one)."""
    modules = _modules()

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        imported: set[str | None] = set()
        pending: list[ast.AST] = [ast.parse(path.read_text(), str(path))]
        while pending:
            for node in ast.iter_child_nodes(pending.pop()):
                if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                    continue  # for the type checker only: never run
                if isinstance(node, ast.Import):
                    imported.update(known(alias.name) for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    imported.add(known(node.module))
                    imported.update(
                        f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules
                    )
                pending.append(node)
        graph[name] = {m for m in imported if m is not None and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_back_through_others():
    assert cycles(import_graph()) == []


def test_a_cycle_is_found_where_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


STAGES = {f"workers.stages.{name}" for name in ("chunker", "extractor", "detector", "resolver", "expiry")}


def test_no_stage_imports_another():
    """A stage hands others work through workers.stages.handoffs, never by importing their module."""
    graph = import_graph()
    assert sorted((stage, other) for stage in STAGES for other in graph[stage] & STAGES) == []


def test_the_layers_import_downwards_only():
    upward = sorted(
        (m, d)
        for m, deps in import_graph().items()
        for d in deps
        if LAYER[d.partition(".")[0]] > LAYER[m.partition(".")[0]]
    )
    assert upward == []


def test_the_query_side_never_imports_the_indexing_stages():
    """The query worker (HTTP, MCP) answers from the store; what it sends a stage (a retraction)
    it makes with the client publisher (workers.publisher), as the CLI does. Before, the MCP
    server imported the resolver's work module for it."""
    graph = import_graph()
    reaching = sorted(
        (m, d)
        for m, deps in graph.items()
        if m.startswith("workers.query") or m == "workers.publisher"
        for d in deps
        if d.startswith("workers.stages")
    )
    assert reaching == []


def test_one_module_makes_the_clients_kafka_producer():
    """Documents, deletions, erasures, retractions and purge events are all sent through
    workers.publisher.ClientPublisher: no other module of the package builds a KafkaProducer
    (the workers' own messages go through faust's producer and the outbox)."""
    makers = sorted(
        str(path.relative_to(ROOT))
        for path in _modules().values()
        if "KafkaProducer(" in path.read_text(encoding="utf-8")
    )
    assert makers == ["workers/publisher.py"]


def test_only_the_pipeline_and_the_benchmarks_import_a_stage():
    """A stage module is imported by the other stages, the pipeline that runs them and the
    benchmarks that time them; what a command shares with a stage (the texts an extraction
    embedded, what an erasure takes) lives in workers.derived. Before, `publish --wait` and
    `tenant delete --purge` imported the erasure stage for it."""
    importers = sorted(
        m
        for m, deps in import_graph().items()
        if any(d.startswith("workers.stages") for d in deps)
        and not m.startswith("workers.stages")
        and m != "workers.pipeline"
        and not m.startswith("ops.bench.")  # the benchmarks: one module of ops.bench each
    )
    assert importers == []


def test_the_pure_algorithms_read_no_redis_format():
    """workers.algorithms is free of I/O and of Redis's formats: the graph's node names, which
    PPR reads, are store.nodes' (pure), not store.keys' (the key layout). Before, retrieval
    imported the key module for them."""
    reaching = sorted(
        (m, d)
        for m, deps in import_graph().items()
        if m.startswith("workers.algorithms")
        for d in deps
        if d.startswith("store") and d != "store.nodes"
    )
    assert reaching == []


def test_the_in_memory_store_loads_no_redis_code():
    """store/in_memory/ restates store/redis/'s rules without its code: importing it loads
    neither the Redis store's modules nor the redis client (the stages' logic is tested without
    them), whatever it imports in turn."""
    import subprocess
    import sys

    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, store.in_memory; print(sorted(m for m in sys.modules"
            " if m.partition('.')[0] in ('redis', 'redisvl') or m.startswith(('store.redis', 'store.memory'))))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == "[]"
