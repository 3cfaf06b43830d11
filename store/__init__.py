"""Redis: the memory layers, graph, vector indexes, progress and idempotency marks."""

from store.graph_log import EdgeChange
from store.keys import LAYERS, TenantKeys
from store.memory import AlreadyDone, Hit, Memory, Outgoing, StaleDecision

__all__ = ["LAYERS", "AlreadyDone", "EdgeChange", "Hit", "Memory", "Outgoing", "StaleDecision", "TenantKeys"]
