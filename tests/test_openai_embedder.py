"""The embeddings endpoint (MEMSTREAM_EMBEDDER=openai): the real `openai` client
against ops.fake_llm.FakeEmbeddings (a test double) — bounded batches and requests in flight,
retries, clear errors, checked vectors, the shared Redis cache — and a tenant's record of the
embedder its indexes were built with: writing or querying it with another is a clear error."""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
import pytest

from ops.fake_llm import FakeEmbeddings
from store import Memory
from store.in_memory import InMemoryStore
from store.records import UNRECORDED_EMBEDDER, EmbedderId
from tests.inprocess import DigitBlindEmbedder, InProcess, ScriptedExtractor
from topics import Chunk
from workers.models.embedding import (
    BatchingEmbedder,
    EmbedderError,
    EmbedderMismatch,
    EmbedderRefused,
    EndpointConfig,
    OpenAIEmbedder,
    embedder_id,
    make_embedder,
)
from workers.settings import Settings

TEXTS = [f"text number {i}" for i in range(10)]


def endpoint(fake: FakeEmbeddings, model: str = "fake-model", **config) -> OpenAIEmbedder:
    """The endpoint embedder at the fake, retrying fast."""
    return OpenAIEmbedder(
        EndpointConfig(fake.base_url, "test-key", model, **{"dims": 384, "backoff_base_s": 0.01, **config})
    )


def test_texts_go_in_bounded_batches_with_bounded_requests_in_flight_and_come_back_normalised_in_order():
    with FakeEmbeddings(latency_s=0.05) as fake:
        embedder = endpoint(fake, batch=3, concurrency=2)
        vectors = asyncio.run(embedder.aembed(TEXTS))
    assert sorted(len(r["input"]) for r in fake.requests) == [1, 3, 3, 3]
    assert all(
        r["model"] == "fake-model" and r["dimensions"] == 384 and r["encoding_format"] == "base64"
        for r in fake.requests
    )
    assert 1 <= fake.max_in_flight <= 2
    assert vectors.dtype == np.float32 and vectors.shape == (10, 384)
    assert np.allclose(vectors, np.asarray([FakeEmbeddings.vector(t, 384) for t in TEXTS]), atol=1e-6)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)


def test_a_server_answering_floats_where_base64_was_asked_is_read_alike():
    with FakeEmbeddings() as fake:
        fake.script.append({"floats": True})
        floats = asyncio.run(endpoint(fake).aembed(["alpha", "beta"]))
        encoded = asyncio.run(endpoint(fake).aembed(["alpha", "beta"]))
    assert np.array_equal(floats, encoded) and np.allclose(floats[0], FakeEmbeddings.vector("alpha", 384), atol=1e-6)


def test_429_and_500_are_retried_then_the_answer_is_used():
    with FakeEmbeddings() as fake:
        fake.script.extend([{"status": 429}, {"status": 500}])
        vectors = asyncio.run(endpoint(fake).aembed(["alpha", "beta"]))
    assert fake.calls == 3 and fake.texts == ["alpha", "beta"]
    assert np.allclose(vectors[1], FakeEmbeddings.vector("beta", 384), atol=1e-6)


def test_a_400_is_a_clear_error_at_once():
    with FakeEmbeddings() as fake:
        fake.script.append({"status": 400})
        with pytest.raises(EmbedderError, match=r"refused the request \(model 'fake-model', 2 texts\): HTTP 400"):
            asyncio.run(endpoint(fake).aembed(["alpha", "beta"]))
    assert fake.calls == 1


def test_a_server_answering_another_size_or_count_is_a_clear_error():
    with FakeEmbeddings() as fake:
        fake.script.extend([{"dims": 8}, {"count": 1}])
        embedder = endpoint(fake)
        with pytest.raises(
            EmbedderError, match="answered vectors of 8 dims for model 'fake-model'; this worker's indexes are 384 dims"
        ):
            asyncio.run(embedder.aembed(["alpha", "beta"]))
        with pytest.raises(EmbedderError, match="answered 1 vectors for 2 texts"):
            asyncio.run(embedder.aembed(["alpha", "beta"]))


def test_without_dims_the_model_size_is_asked_once_and_no_dimensions_are_sent():
    with FakeEmbeddings(dims=16) as fake:
        embedder = endpoint(fake, dims=0)
        vectors = asyncio.run(embedder.aembed(["alpha"]))
    assert embedder.dims == 16 and vectors.shape == (1, 16)
    assert fake.calls == 2 and all("dimensions" not in r for r in fake.requests)


def test_make_embedder_names_the_missing_settings_and_the_cache_key_names_model_and_dims():
    with pytest.raises(
        ValueError, match="MEMSTREAM_EMBEDDER=openai needs MEMSTREAM_EMBEDDER_BASE_URL and MEMSTREAM_EMBEDDER_MODEL"
    ):
        make_embedder(Settings.from_env({"MEMSTREAM_EMBEDDER": "openai", "MEMSTREAM_EMBEDDER_MODEL": "m"}))
    with pytest.raises(ValueError, match="MEMSTREAM_EMBEDDER='torch': expected local or openai"):
        Settings.from_env({"MEMSTREAM_EMBEDDER": "torch"})
    with FakeEmbeddings() as fake:
        embedder = make_embedder(
            Settings.from_env(
                {
                    "MEMSTREAM_EMBEDDER": "openai",
                    "MEMSTREAM_EMBEDDER_BASE_URL": fake.base_url,
                    "MEMSTREAM_EMBEDDER_MODEL": "text-embedding-3-small",
                    "MEMSTREAM_EMBEDDER_DIMS": "256",
                    "MEMSTREAM_EMBEDDER_BATCH": "7",
                    "MEMSTREAM_EMBEDDER_CONCURRENCY": "3",
                }
            )
        )
    assert embedder_id(embedder) == EmbedderId("openai:text-embedding-3-small", 256)
    assert embedder_id(embedder).cache_name == "openai:text-embedding-3-small:256"
    assert (embedder.config.batch, embedder.config.concurrency) == (7, 3)


def test_the_redis_embedding_cache_serves_a_second_run_without_a_request(stack_env):
    async def run(fake, model):
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"])
        try:
            embedder = endpoint(fake, model)  # a fresh process's embedder: nothing cached in it
            return await BatchingEmbedder(
                embedder, cache=memory.embedding_cache(embedder_id(embedder).cache_name)
            ).embed(texts)
        finally:
            await memory.close()

    texts = [f"{uuid.uuid4().hex} {t}" for t in TEXTS]
    model = f"cached-{uuid.uuid4().hex[:8]}"
    with FakeEmbeddings() as fake:
        first = asyncio.run(run(fake, model))
        after_first = fake.calls
        second = asyncio.run(run(fake, model))
        after_second = fake.calls
        asyncio.run(run(fake, model + "-other"))  # another model shares no vectors
    assert after_first == 1 and after_second == 1 and fake.calls == 2
    assert np.array_equal(first, second)


class OtherEmbedder(DigitBlindEmbedder):
    """Test double: another model of the same size as DigitBlindEmbedder."""

    name = "other-model"


async def indexed(memory=None) -> InProcess:
    stages = InProcess(None, ScriptedExtractor({"Ada lives in Paris.": [("Ada", "lives in", "Paris")]}), memory=memory)
    await stages.publish("doc-1", "Ada lives in Paris.")
    return stages


def test_querying_a_tenant_with_another_embedder_than_it_was_indexed_with_is_an_error_naming_both():
    async def main():
        stages = await indexed()
        answer = await stages.query("Where does Ada live?")
        other = InProcess(None, ScriptedExtractor({}), OtherEmbedder(), memory=stages.memory, tenant=stages.tenant)
        with pytest.raises(EmbedderMismatch) as mismatch:
            await other.query("Where does Ada live?")
        return answer, str(mismatch.value)

    answer, message = asyncio.run(main())
    assert answer["passages"] and not answer.get("error")
    assert (
        "indexed with DigitBlindEmbedder (384 dims)" in message
        and "this worker embeds with other-model (384 dims)" in message
    )


def test_writing_a_tenant_with_another_embedder_dead_letters_the_chunk_with_the_reason():
    async def main():
        stages = await indexed()
        other = InProcess(
            None,
            ScriptedExtractor({"Bo lives in Rome.": [("Bo", "lives in", "Rome")]}),
            OtherEmbedder(),
            memory=stages.memory,
            tenant=stages.tenant,
        )
        await other.publish("doc-2", "Bo lives in Rome.")
        return other.dead_letters()

    letters = asyncio.run(main())
    assert [letter["topic"] for letter in letters] == ["memstream.chunks"]
    assert (
        "indexed with DigitBlindEmbedder (384 dims), but this worker embeds with other-model (384 dims)"
        in letters[0]["error"]
    )


def test_a_tenant_indexed_before_records_adopts_an_embedder_of_its_size_else_is_an_error():
    async def main():
        store = InMemoryStore(384)
        await store.ensure_indexes("old")  # indexed before embedders were recorded
        await store.ensure_indexes("older")
        adopted = await store.claim_embedder("old", EmbedderId("local", 384), False)
        kept = await store.claim_embedder("old", EmbedderId("openai:m", 384), True)
        refused = await store.claim_embedder("older", EmbedderId("openai:m", 1536), True)
        unknown = await store.claim_embedder("new", EmbedderId("local", 384), False)
        return adopted, kept, refused, unknown

    adopted, kept, refused, unknown = asyncio.run(main())
    assert adopted == kept == EmbedderId("local", 384)
    assert refused == EmbedderId(UNRECORDED_EMBEDDER, 384) and unknown is None


def test_redis_records_the_first_claim_and_reads_an_old_tenant_size_from_its_index(stack_env):
    async def main():
        tenant, old = f"emb-{uuid.uuid4().hex[:8]}", f"emb-old-{uuid.uuid4().hex[:8]}"
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"], dims=12)
        try:
            unknown = await memory.claim_embedder(tenant, EmbedderId("a", 12), False)
            first = await asyncio.gather(
                memory.claim_embedder(tenant, EmbedderId("a", 12), True),
                memory.claim_embedder(tenant, EmbedderId("b", 12), True),
            )
            await memory.ensure_indexes(
                old
            )  # a tenant with 12-dim vectors indexed and no record (written before records were kept)
            pipe = memory.pipeline(old)
            memory.stage_passage(pipe, old, Chunk(old, "c1", "d1", 0, 1, "an old passage"), [], np.ones(12))
            await pipe.execute()
            refused = await memory.claim_embedder(old, EmbedderId("big", 1536), True)
            adopted = await memory.claim_embedder(old, EmbedderId("small", 12), False)
            again = await memory.claim_embedder(old, EmbedderId("other", 12), True)
            return unknown, first, refused, adopted, again
        finally:
            await memory.close()

    unknown, first, refused, adopted, again = asyncio.run(main())
    assert unknown is None and first[0] == first[1] == EmbedderId("a", 12)
    assert refused == EmbedderId(UNRECORDED_EMBEDDER, 12) and adopted == again == EmbedderId("small", 12)


def test_the_query_api_answers_a_query_with_another_embedder_as_json_naming_both(stack_env):
    from aiohttp.test_utils import TestClient, TestServer

    from workers.query.server import query_app

    async def main(fake):
        stages = InProcess(
            stack_env["MEMSTREAM_REDIS_URL"],
            ScriptedExtractor({"Ada lives in Paris.": [("Ada", "lives in", "Paris")]}),
            BatchingEmbedder(endpoint(fake, "model-a")),
        )
        try:
            await stages.publish("doc-1", "Ada lives in Paris.")
            settings = Settings(redis_url=stack_env["MEMSTREAM_REDIS_URL"], tenant=stages.tenant)
            answers = []
            for model in ("model-a", "model-b"):
                async with TestClient(
                    TestServer(query_app(settings, BatchingEmbedder(endpoint(fake, model))))
                ) as client:
                    response = await client.post("/v1/query", json={"query": "Where does Ada live?"})
                    answers.append((response.status, await response.json()))
            return stages.dead_letters(), answers
        finally:
            await stages.close()

    with FakeEmbeddings() as fake:
        letters, (same, other) = asyncio.run(main(fake))
    assert letters == [] and same[0] == 200 and same[1]["passages"][0]["text"] == "Ada lives in Paris."
    assert other[0] == 409 and set(other[1]) == {"error"}
    assert (
        "indexed with openai:model-a (384 dims), but this worker embeds with openai:model-b (384 dims)"
        in other[1]["error"]
    )


def test_a_worker_with_the_endpoint_embedder_indexes_and_answers_in_the_models_size(make_workers, tmp_path):
    """`memstream worker` with MEMSTREAM_EMBEDDER=openai and no dims set: it asks the model's size
    (64 here, not the local model's 384), creates the tenant's indexes of that size, and embeds
    passages and queries through the endpoint."""
    from tests.conftest import write_docs

    tenant = f"emb-e2e-{uuid.uuid4().hex[:8]}"
    model = f"fake-64-{uuid.uuid4().hex[:8]}"  # a model of its own: no vector of an earlier run in the shared cache
    text = "Oskar Lind runs the Tarn Mill. The Tarn Mill grinds rye for Port Selka."
    with FakeEmbeddings(dims=64) as fake:
        workers = make_workers(embedder="openai", embedder_base_url=fake.base_url, embedder_model=model)
        workers.start()
        workers.cli.run(
            "publish", *write_docs(tmp_path / "d", {"mill": text}), "--tenant", tenant, "--wait", "--timeout", "180"
        )
        answer = workers.cli.query("Who runs the Tarn Mill?", tenant)
    assert [p["text"] for p in answer["passages"]] == [text]
    assert text in fake.texts and "Who runs the Tarn Mill?" in fake.texts
    assert all("dimensions" not in r and r["model"] == model for r in fake.requests)


def refusing(fake_text: str) -> FakeEmbeddings:
    """The fake refusing (HTTP 400) any request that holds a text containing `fake_text`."""
    return FakeEmbeddings(refuse=lambda text: fake_text in text)


def test_a_text_refused_in_a_merged_batch_fails_only_its_own_caller():
    async def main(fake):
        batching = BatchingEmbedder(endpoint(fake))
        return await asyncio.gather(
            batching.embed(["alpha", "beta"]),
            batching.embed(["a passage TOO LONG for the model"]),
            batching.embed(["gamma"]),
            return_exceptions=True,
        )

    with refusing("TOO LONG") as fake:
        good, refused, other = asyncio.run(main(fake))
    assert isinstance(refused, EmbedderRefused) and "HTTP 400" in str(refused)
    assert np.allclose(good[1], FakeEmbeddings.vector("beta", 384), atol=1e-6)
    assert np.allclose(other[0], FakeEmbeddings.vector("gamma", 384), atol=1e-6)
    assert len(fake.requests[0]["input"]) == 4  # one merged request first, then each caller alone


def test_a_chunk_whose_text_the_endpoint_refuses_is_dead_lettered_at_once_and_the_others_are_indexed():
    async def main(fake):
        stages = InProcess(
            None,
            ScriptedExtractor(
                {"Ada lives in Oslo.": [("Ada", "lives in", "Oslo")], "A passage TOO LONG for the model.": []}
            ),
            BatchingEmbedder(endpoint(fake)),
        )
        await stages.publish("doc-1", "Ada lives in Oslo.", wait=False)
        await stages.publish("doc-2", "A passage TOO LONG for the model.", wait=False)
        await stages.drain()
        return stages.dead_letters(), await stages.memory.document_statuses(stages.tenant, ["doc-1"])

    with refusing("TOO LONG") as fake:
        letters, (status,) = asyncio.run(main(fake))
    assert [(letter["topic"], letter["attempts"]) for letter in letters] == [("memstream.chunks", 1)]
    assert "refused the request" in letters[0]["error"] and "HTTP 400" in letters[0]["error"]
    assert status is not None and status.chunks_done == status.chunks == 1


def test_a_refused_key_or_a_server_down_past_the_retries_is_an_outage_and_a_refused_text_is_not():
    from workers.envelope import is_outage
    from workers.models.embedding import EmbedderUnavailable

    with FakeEmbeddings() as fake:
        errors = []
        for script in (
            [{"status": 401}],
            [{"status": 404}],
            [{"status": 503}, {"status": 503}],
            [{"status": 413}],
            [{"status": 422}],
        ):
            fake.script.extend(script)
            with pytest.raises(EmbedderError) as raised:
                asyncio.run(endpoint(fake, max_attempts=2).aembed(["alpha"]))
            errors.append(raised.value)
    unavailable, refused = errors[:3], errors[3:]
    assert all(isinstance(e, EmbedderUnavailable) and is_outage(e) for e in unavailable)
    assert "HTTP 401" in str(unavailable[0]) and "still failing after 2 attempts" in str(unavailable[2])
    assert all(isinstance(e, EmbedderRefused) and not is_outage(e) for e in refused)
