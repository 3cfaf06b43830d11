"""The local embedder's batching: texts of similar length together, under a token budget
(workers.models.embedding.token_batches), with the vectors encode gives text by text."""

import numpy as np

from workers.models.embedding import TOKEN_BUDGET, LocalEmbedder, token_batches


def test_batches_hold_texts_of_similar_length_within_the_budget_and_a_longer_text_alone():
    lengths = [5, 150, 3, 600, 4, 150, 150, 150]
    batches = token_batches(lengths, 512)
    assert batches == [[2, 4, 0], [1, 5, 6], [7], [3]]
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    assert all(len(b) * max(lengths[i] for i in b) <= 512 for b in batches if len(b) > 1)
    assert token_batches([], 512) == []


def test_vectors_are_those_of_each_text_encoded_alone_in_the_callers_order():
    embedder = LocalEmbedder()
    passage = " ".join(["The bridge over the river was built in 1890 by the city's engineers."] * 12)
    texts = [
        "Ada Lovelace",
        passage,
        "PERSON founded ORGANIZATION",
        "Ada Lovelace founded Analytical Engines",
        passage + " Again.",
    ]
    vectors = embedder.embed(texts)
    alone = np.stack([embedder._model.encode([t], normalize_embeddings=True)[0] for t in texts])
    assert vectors.shape == (5, 384) and vectors.dtype == np.float32
    assert np.allclose(vectors, alone, atol=1e-5)
    lengths = [len(ids) for ids in embedder._model.tokenizer(texts)["input_ids"]]
    assert len(token_batches(lengths, TOKEN_BUDGET)) >= 2  # the passages do not pad the short texts


class SlowModel:
    """A test double of a local model: sync `embed`, 50 ms a call, records each call's texts."""

    dims = 4

    def __init__(self):
        self.calls: list[list[str]] = []

    def embed(self, texts):
        import time

        self.calls.append(list(texts))
        time.sleep(0.05)
        return np.ones((len(texts), 4), dtype=np.float32) / 2


def test_calls_made_while_a_local_model_is_busy_go_together_in_its_next_batch():
    import asyncio

    from workers.models.embedding import BatchingEmbedder

    async def main():
        batching = BatchingEmbedder(SlowModel())
        first = asyncio.ensure_future(batching.embed(["a"]))
        await asyncio.sleep(0.01)  # the model is busy with ["a"]
        rest = [asyncio.ensure_future(batching.embed([f"t{i}"])) for i in range(3)]
        await asyncio.sleep(0.01)
        rest += [asyncio.ensure_future(batching.embed(["t3", "t4"]))]
        results = await asyncio.gather(first, *rest)
        return batching.embedder.calls, results

    calls, results = asyncio.run(main())
    assert calls == [["a"], ["t0", "t1", "t2", "t3", "t4"]]
    assert [len(r) for r in results] == [1, 1, 1, 1, 2]


def test_a_caller_cancelled_while_the_model_is_busy_strands_no_other_caller():
    """The read-ahead cancels the prefetch of a message found done; its queued embed call must
    not take down the batch it sat in (the reviewer's reproduction: the other caller hung)."""
    import asyncio

    from workers.models.embedding import BatchingEmbedder

    async def main():
        batching = BatchingEmbedder(SlowModel())
        busy = asyncio.ensure_future(batching.embed(["a"]))
        await asyncio.sleep(0.01)  # the model is busy with ["a"] until 50 ms
        gone, kept, late = (asyncio.ensure_future(batching.embed([text])) for text in ("prefetched", "handled", "late"))
        await asyncio.sleep(0.01)
        gone.cancel()  # cancelled while queued
        await asyncio.sleep(0.05)
        late.cancel()  # cancelled while its batch is in the model (50–100 ms)
        return await asyncio.wait_for(asyncio.gather(busy, kept), 5), batching.embedder.calls

    (busy, kept), calls = asyncio.run(main())
    assert len(busy) == 1 and len(kept) == 1
    assert calls == [["a"], ["handled", "late"]]
