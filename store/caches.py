"""The model caches, shared by every worker and tenant: an answer is a function of its input
alone. LLM answers by (model, hash of the prompt and schema), 30 days; embedding vectors by
(embedder, hash of the text), 7 days. Keys live in store.keys; callers see get/put only."""

from __future__ import annotations

import hashlib
import json

import numpy as np

from store.keys import embedding_cache_key, llm_cache_key

LLM_CACHE_TTL_S = 30 * 24 * 3600
EMBEDDING_CACHE_TTL_S = 7 * 24 * 3600


class LLMCache:
    def __init__(self, redis, model: str):
        self.redis = redis
        self.model = model

    def key(self, messages: list[dict], schema: dict) -> str:
        prompt = json.dumps({"messages": messages, "schema": schema}, sort_keys=True, ensure_ascii=False)
        return llm_cache_key(self.model, hashlib.sha256(prompt.encode()).hexdigest())

    async def get(self, messages: list[dict], schema: dict) -> str | None:
        raw = await self.redis.get(self.key(messages, schema))
        return None if raw is None else raw.decode("utf-8")

    async def put(self, messages: list[dict], schema: dict, answer: str) -> None:
        await self.redis.set(self.key(messages, schema), answer, ex=LLM_CACHE_TTL_S)


def text_sha256(text: str) -> str:
    """The SHA-256 of a text (hex): what the embedding cache keys a text's vector by."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class EmbeddingCache:
    def __init__(self, redis, embedder: str):
        self.redis = redis
        self.embedder = embedder

    def key(self, text: str) -> str:
        return self.key_of_digest(text_sha256(text))

    def key_of_digest(self, text_sha256: str) -> str:
        """The key of a text's vector by the text's SHA-256 (a turn's passage records the one of
        what it embedded, not the text: store.records.TurnEmbedding)."""
        return embedding_cache_key(self.embedder, text_sha256)

    async def get_many(self, texts: list[str]) -> dict[str, np.ndarray]:
        """The cached vectors of those texts that have one."""
        if not texts:
            return {}
        rows = await self.redis.mget([self.key(t) for t in texts])
        return {t: np.frombuffer(raw, dtype=np.float32) for t, raw in zip(texts, rows) if raw is not None}

    async def put_many(self, vectors: dict[str, np.ndarray]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for text, vector in vectors.items():
            pipe.set(self.key(text), np.asarray(vector, dtype=np.float32).tobytes(), ex=EMBEDDING_CACHE_TTL_S)
        await pipe.execute()

    # ---- benchmarks: a run that must embed a corpus itself (ops/bench/rules.py) ----
    async def forget_many(self, texts: list[str]) -> None:
        """Drop the cached vectors of these texts (the others stay)."""
        for start in range(0, len(texts), 1000):
            await self.redis.delete(*[self.key(t) for t in texts[start : start + 1000]])
