"""What every indexing stage is built from: one context, passed by keyword."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from store.base import MemoryStore
from store.facts import Lifecycle
from workers.envelope import Once
from workers.models.protocols import ChatModel, Embedder, Extractor
from workers.settings import Settings


@dataclass(frozen=True, kw_only=True)
class StageContext:
    settings: Settings
    memory: MemoryStore
    lifecycle: Lifecycle
    once: Once  # the envelope's effectively-once commit (workers.envelope.Envelope.once)
    embedder: Embedder | None = None  # A_ext
    extractor: Extractor | None = None  # A_ext
    resolver_llm: ChatModel | None = None  # A_res; None: the deterministic evidence policy


T = TypeVar("T")


def needed(part: T | None, what: str) -> T:
    """A part of the context a stage cannot run without (a worker whose roles do not run the
    stage may be built without it: the stage is built, never handed a message)."""
    if part is None:
        raise RuntimeError(f"this stage needs {what}; the pipeline was built without one")
    return part


class Stage:
    """A stage: `handle(record)` runs one decoded message through `once`."""

    def __init__(self, context: StageContext):
        self.context = context
        self.settings = context.settings
        self.memory = context.memory
        self.lifecycle = context.lifecycle
        self.once = context.once


async def current_passage(memory, pipe, tenant: str, passage_id: str, incarnation: int) -> bool:
    """Whether the passage is in memory at this incarnation (workers.stages.chunker: versions),
    fenced on `pipe`: a version that retires or restores it before the commit makes the
    decision run again. A message about a passage out of memory counts nothing."""
    state = (await memory.passage_states(tenant, [passage_id]))[0]
    if state.retired or state.incarnation != incarnation:
        return False
    memory.expect_passage(pipe, tenant, passage_id, state)
    return True
