"""The query side's Redis client and embedder: what the HTTP server (workers.query.server), an
`all` worker (workers.app) and `memstream mcp` (workers.query.mcp_server) each build alike."""

from __future__ import annotations

from store import Memory
from store.base import Lifetime
from workers.models.embedding import BatchingEmbedder, embedder_id, make_embedder
from workers.query.engine import REDIS_CALLS_PER_QUERY
from workers.settings import Settings


def query_memory(settings: Settings) -> Memory:
    """The query side's Redis client, with a pool of its own sized to the requests admitted at
    once, so an admitted request does not wait for a connection, a query burst does not starve
    the indexing agents of an `all` worker, and a saturated pool queues commands (then 503s)
    instead of raising "Too many connections"."""
    return Memory.from_url(
        settings.redis_url,
        max_connections=REDIS_CALLS_PER_QUERY * settings.query_max_inflight,
        pool_timeout=settings.redis_pool_timeout,
        tau=settings.effective_tau,
        vector_index=settings.vector_index,
    )


def cached_embedder(settings: Settings, memory: Lifetime, model=None) -> BatchingEmbedder:
    """The configured embedder (or `model`, made from it already) behind a BatchingEmbedder whose
    vectors are cached in `memory` (shared by every worker) under its name and dims; one per
    process, for the extractor and the query side alike."""
    model = model or make_embedder(settings)
    return BatchingEmbedder(model, cache=memory.embedding_cache(embedder_id(model).cache_name))
