"""The model interfaces the stages and the query engine depend on. Production implementations:
`workers.models.llm.LLMClient` (any OpenAI-compatible chat endpoint),
`workers.models.embedding.BatchingEmbedder` over `LocalEmbedder` or `OpenAIEmbedder`, the extractors of
`workers.models.extraction`. Tests pass their own doubles (tests/inprocess.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np

from topics.records import Triple


@dataclass(frozen=True)
class Entity:
    name: str
    type: str


@dataclass
class Extraction:
    """What an Extractor finds in a passage: its entities and its facts."""

    entities: list[Entity] = field(default_factory=list)
    facts: list[Triple] = field(default_factory=list)


class Embedder(Protocol):
    """Texts → L2-normalised float32 vectors, one row per text, `dims` columns. Its `name` (with
    dims: workers.models.embedding.embedder_id) is what a tenant's indexes record."""

    dims: int

    async def embed(self, texts: list[str]) -> np.ndarray: ...


class ChatModel(Protocol):
    """One structured chat call: the answer is JSON following `schema`; `validate(parsed)`
    returns the value or raises ValueError (the client may ask once to repair it). Raises
    workers.models.llm.LLMError when the endpoint keeps failing, MalformedOutput when the answer
    stays invalid."""

    async def structured(
        self, stage: str, messages: list[dict], schema_name: str, schema: dict, validate: Callable[[Any], Any]
    ) -> Any: ...


class Extractor(Protocol):
    """A_ext's model: a chunk's text → typed entities and facts. `context` is the chunk's
    context line (Chunk.context: who said a turn and when, workers.algorithms.turns), '' for a
    plain document: it informs the extraction (a turn's speaker heads its constraints and
    rejections) but is not part of the passage."""

    name: str
    # True: every name it returns is written in the text (or is the context line's speaker) and
    # every category is a cue of the text's sentences, so A_ext admits its output as is (the
    # rules extractor). Otherwise — and for an extractor without the attribute — A_ext admits
    # only what workers.algorithms.grounding finds in the passage.
    grounded: bool

    async def extract(self, text: str, context: str = "") -> Extraction: ...
