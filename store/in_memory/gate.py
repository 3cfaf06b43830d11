"""The τ gate in process (store.base.Gate), as store/redis/gate.py: a fact of a schema not
yet stable parked as pending (hold_pending: _HOLD_PENDING there); a schema's status and
support, read and fenced; its parked facts drained, or parked again."""

from __future__ import annotations

from store.in_memory.base import InMemoryBase, _text


class GateOps(InMemoryBase):
    """store.base.Gate in process (store.redis.gate.GateOps on Redis)."""

    async def hold_pending(self, tenant: str, schema_id: str, fact_id: str, passage_id: str) -> bool | None:
        """As store/redis/gate.py's _HOLD_PENDING: parked unless the schema is stable, checked and parked
        at once (no await between); None: a version retired the passage."""
        records = self._tenant(tenant).records
        if records["passages"].get(passage_id, {}).get("retired") == "1":
            return None
        if records["schemas"].get(schema_id, {}).get("status") == "stable":
            return False
        self._revise(tenant, passage_id)
        self._set(tenant, "schema_pending", schema_id).add(fact_id)
        self._set(tenant, "fact_passages", fact_id).add(passage_id)
        self._set(tenant, "passage_facts", passage_id).add(fact_id)
        if records["facts"].get(fact_id, {}).get("status") in ("new", "retracted"):
            self._hset(tenant, "facts", fact_id, {"status": "pending"})
        return True

    async def pending_facts(self, tenant: str, schema_id: str) -> list[str]:
        return sorted(self._set(tenant, "schema_pending", schema_id))

    def stage_unpend(self, pipe, tenant: str, schema_id: str, fact_ids: list[str]) -> None:
        if fact_ids:
            unpended = list(fact_ids)
            self._stage(pipe, lambda: self._set(tenant, "schema_pending", schema_id).difference_update(unpended))

    def stage_pend(self, pipe, tenant: str, schema_id: str, fact_ids: list[str]) -> None:
        if fact_ids:
            pended = list(fact_ids)
            self._stage(pipe, lambda: self._set(tenant, "schema_pending", schema_id).update(pended))

    async def schema_status(self, tenant: str, schema_id: str) -> str | None:
        return _text(self._tenant(tenant).records["schemas"].get(schema_id, {}).get("status"))

    async def schema_support(self, tenant: str, schema_id: str) -> tuple[str | None, list[str], str | None]:
        record = self._tenant(tenant).records["schemas"].get(schema_id, {})
        frequency = record.get("frequency")
        return (
            _text(record.get("status")),
            sorted(self._tenant(tenant).sets.get(("schema_passages", schema_id), ())),
            None if frequency in (None, "") else str(frequency),
        )

    def expect_schema(self, pipe, tenant: str, schema_id: str, status: str | None, frequency: str | None) -> None:
        pipe.expected.setdefault((tenant, "schemas", schema_id, "status"), status or None)
        pipe.expected.setdefault((tenant, "schemas", schema_id, "frequency"), frequency or None)

    def stage_schema_status(self, pipe, tenant: str, schema_id: str, status: str) -> None:
        self._stage(pipe, lambda: self._hset(tenant, "schemas", schema_id, {"status": status}))
