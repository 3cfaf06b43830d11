"""The expiry sweep: facts whose TTL lapsed leave memory with an `expired` event on
`indexed-facts` and their graph edge dropped; a single-valued group that loses an active fact
this way is decided again (a fact it had excluded may hold now).

No topic feeds it: workers.app runs `Pipeline.expire_lapsed` every MEMSTREAM_EXPIRY_SWEEP_INTERVAL
seconds in the resolver workers (tests call it directly). Each lapsed fact is expired through the
envelope's effectively-once commit under the mark `exp:{fact id}:{expires_at}:{activated_at}`: two
workers that sweep at once commit it once (the other publishes that outbox or skips), a sweep that dies after
its commit is finished by the outbox sweep, and a stage that changes the fact meanwhile makes
the commit fail and the sweep decide again: the commit is fenced on the fact's status (the
resolver) and on the `expires_at` the sweep read (a new supporting passage that moves it leaves the
status active). The index entry goes only if it still says the lapse the sweep saw through.

An expired fact that a new passage supports is back in the index at the new lapse before the
detector brings it back; a sweep that passes that lapse first finds it out of memory and drops the
entry. Activation puts it back (Lifecycle.activate), and the mark names the activation, so that
sweep's mark does not keep the fact, active again, from being expired at the same lapse.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from workers.envelope import Emit
from workers.stages.context import Stage
from workers.stages.handoffs import regroup

SWEEP_BATCH = 500  # lapsed facts read from the index at once
GONE = ("merged", "expired", "retracted")  # no longer in memory: nothing to expire


def expiry_mark(fact_id: str, expires_at: float, activated_at: float | None) -> str:
    """Done mark: one per fact, lapse and time in memory (a fact that regains support lapses
    again later; one brought back after a sweep passed its lapse, at the same lapse)."""
    return f"exp:{fact_id}:{expires_at!r}:{activated_at!r}"


class ExpirySweep(Stage):
    async def run(self, now: float | None = None, tenants: list[str] | None = None) -> int:
        """Expire every fact whose TTL lapsed by `now` (default: the time now) in `tenants`
        (default: every tenant); returns how many were expired (by this sweep, or by another
        running at the same moment)."""
        now = time.time() if now is None else now
        expired: set[tuple[str, str]] = set()
        for tenant in await self.memory.tenants() if tenants is None else tenants:
            seen = None
            # each fact seen through leaves the index's lapsed range (expired, or its lapse moved)
            while (lapsed := await self.memory.lapsed_facts(tenant, now, SWEEP_BATCH)) and lapsed != seen:
                for fid, expires_at in lapsed:
                    # the decision reads the fact again, fenced: this read only names the mark
                    fact = await self.memory.fact(tenant, fid)
                    mark = expiry_mark(fid, expires_at, fact.activated_at if fact else None)
                    await self.once(tenant, mark, self._decision(tenant, fid, expires_at, now, expired))
                seen = lapsed
        return len(expired)

    def _decision(self, tenant: str, fid: str, indexed_at: float, now: float, expired: set):
        """`indexed_at`: when the expiry index said the fact lapses."""

        async def decide(pipe) -> list[Emit]:
            expired.discard((tenant, fid))  # a decision taken again counts as it decides now
            fact = await self.memory.fact(tenant, fid)
            if fact is None:
                self.memory.stage_expiry_done(pipe, tenant, fid, indexed_at)
                return []
            # anything that changes them meanwhile: decide again
            self.memory.expect_status(pipe, tenant, fid, fact.status)
            self.memory.expect_field(pipe, tenant, fid, "expires_at", fact.expires_at)
            expires_at = fact.expires_at
            if expires_at is None or not fact.lapsed(now):  # (a lapsed fact has an expires_at)
                return []  # a passage supports it longer now (the index already says until when)
            self.memory.stage_expiry_done(pipe, tenant, fid, expires_at)
            if fact.status in GONE:
                return []
            was = fact.status
            was_active = was == "active"
            lapsed = datetime.fromtimestamp(expires_at, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
            ttl_over = f"TTL lapsed at {lapsed}"
            expired_event = self.lifecycle.expire(
                pipe, tenant, fact, await self.memory.bump_graph_version(tenant), ttl_over
            )
            # subscribers hear of a fact leaving memory only if they heard of it: not of one that
            # was never activated (new or pending: no event told them of it)
            outbox = [Emit.of(expired_event)] if was in ("active", "invalid") else []
            expired.add((tenant, fid))
            if was_active:
                outbox += await regroup(
                    self.settings,
                    self.memory,
                    tenant,
                    fact,
                    "expiry",
                    f"{fid} expired",
                    f"expired-{fid}-{fact.expires_at!r}",
                )
            return outbox

        return decide
