"""`make demo` (ops.demo.run_demo): the worker it starts serves the tenant the demo writes."""

from __future__ import annotations

import pytest

from ops import demo
from workers.settings import Settings


def test_the_demo_worker_serves_the_tenant_the_demo_writes(monkeypatch, tmp_path):
    """Its /mcp (and the explorer's and CLI's default) served tenant 'default', which the demo
    never writes: it is started with MEMSTREAM_TENANT=demo."""
    spawned: list[dict] = []

    class Started(Exception):
        pass

    class StackDouble:  # test double: no Kafka or Redis is started
        def __init__(self, settings):
            pass

        def up(self, progress):
            pass

    def spawn(log, env=None, *args, **kwargs):
        spawned.append(env or {})
        raise Started

    monkeypatch.setattr(demo, "Stack", StackDouble)
    monkeypatch.setattr(demo, "ensure_topics", lambda settings: None)
    monkeypatch.setattr(demo.WorkerProcess, "spawn", spawn)
    with pytest.raises(Started):
        demo.run_demo(Settings(home=tmp_path))
    assert [env.get("MEMSTREAM_TENANT") for env in spawned] == [demo.TENANT] == ["demo"]
