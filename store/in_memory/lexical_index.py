"""The lexical index in process: Layers' ensure_indexes and promote_lexical, as
store/redis/lexical_index.py holds them on Redis, and the BM25 index the lexical leg
(store/in_memory/search.py) searches: bm25s over a snapshot of the tenant's passages, built
again on the first search after they change."""

from __future__ import annotations

import numpy as np

from store.in_memory.base import InMemoryBase, _text
from store.lexical import K1, LEXICAL_FIELD, B


class LexicalIndexOps(InMemoryBase):
    """Layers' indexes in process (store.redis.lexical_index.LexicalIndexOps on Redis)."""

    async def ensure_indexes(self, tenant: str) -> None:
        self._tenant(tenant).indexed = True  # (no index to lose: Redis may restart empty, this store does not)

    async def promote_lexical(self, tenant: str, progress=None) -> int:
        """Memory.promote_lexical: nothing to do here, where bm25s scores a tenant of any size by
        its own statistics already; how many passages the tenant holds."""
        count = len(self._tenant(tenant).records["passages"])
        if progress is not None:
            progress(count, count)
        return count

    async def own_lexical_upkeep(self) -> list[str]:
        """Memory.own_lexical_upkeep: none here, where no index is kept apart from the passages."""
        return []


class _LexicalIndex:
    """bm25s over one snapshot of a tenant's passages (ids sorted, so ties order by id)."""

    def __init__(self, passages: dict[str, dict]):
        import bm25s  # only a lexical search needs it

        self.size = len(passages)
        self.ids = sorted(passages)
        corpus = [(_text(passages[pid].get(LEXICAL_FIELD)) or "").split() for pid in self.ids]
        self.model = bm25s.BM25(method="lucene", k1=K1, b=B) if self.ids else None
        if self.model is not None:
            self.model.index(corpus, show_progress=False)

    def search(self, terms: list[str], k: int) -> list[tuple[str, float]]:
        if self.model is None:
            return []
        known = [t for t in terms if t in self.model.vocab_dict]
        if not known:
            return []
        scores = self.model.get_scores(known)
        matching = np.flatnonzero(scores > 0)
        order = sorted(matching.tolist(), key=lambda i: (-float(scores[i]), self.ids[i]))[:k]
        # bm25s's Lucene form leaves out the constant (k1 + 1) of the numerator; BM25STD has it
        return [(self.ids[i], float(scores[i]) * (K1 + 1)) for i in order]
