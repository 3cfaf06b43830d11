"""A worker's sends wait for the broker's acks at most SEND_ACK_TIMEOUT_S (workers/app.py
`acked`): aiokafka's idempotent producer retries a sent batch while the broker is silent, so an
ack was waited for without end, outside the envelope's outage deadline and metrics. The
deliveries here are test doubles of the futures faust's Topic.send returns; the worker itself
meets a silent broker in tests/test_crash.py (its stop) and a failed leader in
tests/test_brokers.py."""

from __future__ import annotations

import asyncio

import pytest

from workers import app
from workers.envelope import is_outage


def test_acks_that_never_come_fail_the_send_as_an_outage(monkeypatch):
    monkeypatch.setattr(app, "SEND_ACK_TIMEOUT_S", 0.2)

    async def main():
        loop = asyncio.get_running_loop()
        came, never = loop.create_future(), loop.create_future()
        came.set_result("metadata")
        with pytest.raises(TimeoutError) as raised:
            await asyncio.wait_for(app.acked([came, never]), 5)
        assert "Kafka acknowledged 1 of 2 sent message(s) in 0 s" in str(raised.value)
        assert is_outage(raised.value)  # retried with backoff, up to the outage deadline
        never.set_result("late")  # a late ack is retrieved in the background: no warning
        await asyncio.sleep(0)

    asyncio.run(main())


def test_every_ack_is_awaited_before_a_failure_is_raised():
    async def main():
        loop = asyncio.get_running_loop()
        failed, later = loop.create_future(), loop.create_future()
        failed.set_exception(ConnectionError("broker gone"))
        loop.call_later(0.05, later.set_result, "metadata")
        with pytest.raises(ConnectionError, match="broker gone"):
            await app.acked([failed, later])
        assert later.done()
        await app.acked([])  # nothing sent: nothing to wait for

    asyncio.run(main())
