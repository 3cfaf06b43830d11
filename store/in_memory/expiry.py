"""Time in memory, in process (store.base.Expiry), as store/redis/expiry.py: a fact's
`expires_at` and its place in the tenant's expiry index kept together — raised as passages
support the fact (_record_lapse, which store/in_memory/layers.py's stage_new_fact runs:
_RECORD_LAPSE there), carried over a merge (_MERGE_LAPSE), indexed again with the fact
(_INDEX_LAPSE), cleared by the sweep (_EXPIRY_DONE)."""

from __future__ import annotations

from store.in_memory.base import InMemoryBase


def _record_lapse(store: InMemoryBase, tenant: str, fact_id: str, lapses_at: float | None) -> None:
    """A passage's support for a fact lapses at `lapses_at` (None: never), as store/redis/expiry.py's
    _RECORD_LAPSE (_RAISE_LAPSE): `expires_at` absent on an existing fact = for ever. A function, not
    a method: store/in_memory/layers.py's stage_new_fact runs it too, as Redis's stages the script."""
    t = store._tenant(tenant)
    record = t.records["facts"].get(fact_id)
    current = (record or {}).get("expires_at") or None
    if lapses_at is None:
        if current is not None:
            assert record is not None  # current was read from it
            del record["expires_at"]
            t.expiry.pop(fact_id, None)
    elif record is None or (current is not None and lapses_at > float(current)):
        store._hset(tenant, "facts", fact_id, {"expires_at": repr(float(lapses_at))})
        t.expiry[fact_id] = float(lapses_at)


class ExpiryOps(InMemoryBase):
    """store.base.Expiry in process (store.redis.expiry.ExpiryOps on Redis)."""

    async def lapsed_facts(self, tenant: str, now: float, limit: int = 500) -> list[tuple[str, float]]:
        expiry = self._tenant(tenant).expiry
        return sorted(((fid, at) for fid, at in expiry.items() if at <= now), key=lambda x: (x[1], x[0]))[:limit]

    def stage_expiry_done(self, pipe, tenant: str, fact_id: str, expires_at: float) -> None:
        """As store/redis/expiry.py's _EXPIRY_DONE."""
        expiry = self._tenant(tenant).expiry

        def write() -> None:
            if expiry.get(fact_id) == float(expires_at):
                del expiry[fact_id]

        self._stage(pipe, write)

    def stage_merged_lapse(self, pipe, tenant: str, source_id: str, target_id: str) -> None:
        """As store/redis/expiry.py's _MERGE_LAPSE."""
        t = self._tenant(tenant)

        def write() -> None:
            source = t.records["facts"].get(source_id)
            if source is not None:
                lapse = source.get("expires_at") or None
                _record_lapse(
                    self, tenant, target_id, None if lapse is None else float(lapse)
                )  # the target exists: a later passage's rule
                t.expiry.pop(source_id, None)

        self._stage(pipe, write)

    def stage_lapse_indexed(self, pipe, tenant: str, fact_id: str) -> None:
        """As store/redis/expiry.py's _INDEX_LAPSE."""
        t = self._tenant(tenant)

        def write() -> None:
            lapse = t.records["facts"].get(fact_id, {}).get("expires_at") or None
            if lapse is not None:
                t.expiry[fact_id] = float(lapse)

        self._stage(pipe, write)
