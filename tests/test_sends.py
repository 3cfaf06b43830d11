"""A worker's sends wait at most SEND_ACK_TIMEOUT_S for the producer to take each message and for
the broker's acks (workers/app.py `sent_and_acked`): aiokafka's idempotent producer retries a
sent batch while the broker is silent, so an ack was waited for without end, outside the
envelope's outage deadline and metrics; with a partition's batch full, taking a message waits up
to faust's producer_request_timeout (1200 s). The sends and deliveries here are test doubles of
faust's Topic.send and the futures it returns; the worker itself meets a silent broker in
tests/test_crash.py (its stop) and a failed leader in tests/test_brokers.py."""

from __future__ import annotations

import asyncio

import pytest

from workers import app
from workers.envelope import is_outage


def _taken(delivery: asyncio.Future):
    async def send():
        return delivery

    return send


def test_acks_that_never_come_fail_the_send_as_an_outage(monkeypatch):
    monkeypatch.setattr(app, "SEND_ACK_TIMEOUT_S", 0.2)

    async def main():
        loop = asyncio.get_running_loop()
        came, never = loop.create_future(), loop.create_future()
        came.set_result("metadata")
        with pytest.raises(TimeoutError) as raised:
            await asyncio.wait_for(app.sent_and_acked([_taken(came), _taken(never)]), 5)
        assert "Kafka took 2 of 2 message(s) to send and answered 1 in 0 s" in str(raised.value)
        assert is_outage(raised.value)  # retried with backoff, up to the outage deadline
        never.set_result("late")  # a late ack is retrieved in the background: no warning
        await asyncio.sleep(0)

    asyncio.run(main())


def test_a_producer_that_never_takes_the_message_fails_the_send_as_an_outage(monkeypatch):
    """The producer's buffer full (its batch waits on a silent broker): the send's own wait is
    under the same deadline."""
    monkeypatch.setattr(app, "SEND_ACK_TIMEOUT_S", 0.2)

    async def main():
        loop = asyncio.get_running_loop()
        came = loop.create_future()
        came.set_result("metadata")

        async def never_taken():
            await asyncio.Event().wait()

        with pytest.raises(TimeoutError) as raised:
            await asyncio.wait_for(app.sent_and_acked([_taken(came), never_taken]), 5)
        assert "Kafka took 1 of 2 message(s) to send and answered 1 in 0 s" in str(raised.value)
        assert is_outage(raised.value)

    asyncio.run(main())


def test_every_ack_is_awaited_before_a_failure_is_raised():
    async def main():
        loop = asyncio.get_running_loop()
        failed, later = loop.create_future(), loop.create_future()
        failed.set_exception(ConnectionError("broker gone"))
        loop.call_later(0.05, later.set_result, "metadata")
        with pytest.raises(ConnectionError, match="broker gone"):
            await app.sent_and_acked([_taken(failed), _taken(later)])
        assert later.done()
        await app.sent_and_acked([])  # nothing to send: nothing to wait for

    asyncio.run(main())
