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


class GatedModel:
    """A test double of a local model: sync `embed` (run off the loop, as a local model's is),
    records each call's texts and holds each call until the test lets it go, so a test says
    what is queued and what is in the model by events, not by sleeps that a loaded machine
    stretches (the 10 ms sleeps before this failed under a busy suite)."""

    dims = 4

    def __init__(self, calls: int = 2):
        import threading

        self.calls: list[list[str]] = []
        self.started = [threading.Event() for _ in range(calls)]
        self.release = [threading.Event() for _ in range(calls)]

    def embed(self, texts):
        n = len(self.calls)
        self.calls.append(list(texts))
        self.started[n].set()
        assert self.release[n].wait(10), f"call {n} never released"
        return np.ones((len(texts), 4), dtype=np.float32) / 2

    async def in_model(self, n: int) -> None:
        """Until call `n` is in the model."""
        import asyncio

        assert await asyncio.to_thread(self.started[n].wait, 10), f"call {n} never started"


async def _queued() -> None:
    """Until tasks just made have run to their first await (queued their texts)."""
    import asyncio

    for _ in range(3):
        await asyncio.sleep(0)


def test_calls_made_while_a_local_model_is_busy_go_together_in_its_next_batch():
    import asyncio

    from workers.models.embedding import BatchingEmbedder

    async def main():
        model = GatedModel()
        batching = BatchingEmbedder(model)
        first = asyncio.ensure_future(batching.embed(["a"]))
        await model.in_model(0)  # the model is busy with ["a"]
        rest = [asyncio.ensure_future(batching.embed([f"t{i}"])) for i in range(3)]
        await _queued()
        rest += [asyncio.ensure_future(batching.embed(["t3", "t4"]))]
        await _queued()
        model.release[0].set()
        await model.in_model(1)
        model.release[1].set()
        results = await asyncio.wait_for(asyncio.gather(first, *rest), 10)
        return model.calls, results

    calls, results = asyncio.run(main())
    assert calls == [["a"], ["t0", "t1", "t2", "t3", "t4"]]
    assert [len(r) for r in results] == [1, 1, 1, 1, 2]


def test_a_caller_cancelled_while_the_model_is_busy_strands_no_other_caller():
    """The read-ahead cancels the prefetch of a message found done; its queued embed call must
    not take down the batch it sat in (the reviewer's reproduction: the other caller hung)."""
    import asyncio

    from workers.models.embedding import BatchingEmbedder

    async def main():
        model = GatedModel()
        batching = BatchingEmbedder(model)
        busy = asyncio.ensure_future(batching.embed(["a"]))
        await model.in_model(0)  # the model is busy with ["a"]
        gone, kept, late = (asyncio.ensure_future(batching.embed([text])) for text in ("prefetched", "handled", "late"))
        await _queued()
        gone.cancel()  # cancelled while queued
        model.release[0].set()
        await model.in_model(1)
        late.cancel()  # cancelled while its batch is in the model
        model.release[1].set()
        return await asyncio.wait_for(asyncio.gather(busy, kept), 10), model.calls

    (busy, kept), calls = asyncio.run(main())
    assert len(busy) == 1 and len(kept) == 1
    assert calls == [["a"], ["handled", "late"]]


def test_a_background_load_leaves_the_process_free_at_once_and_embeds_the_same():
    """`memstream mcp` answered its handshake only after the model loaded (15.8 s): with
    `background` the constructor returns before torch is even imported (a fresh process
    shows it), and the first embed waits for the load."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from workers.models.embedding import LocalEmbedder\n"
        "embedder = LocalEmbedder(background=True)\n"
        "print('sentence_transformers' in sys.modules and embedder._loaded is not None)\n"
        "print(embedder.embed(['Ada Lovelace']).shape)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    # the import may have begun on the loading thread, but the model is never loaded by then
    first, shape = out.stdout.split("\n")[:2]
    assert first == "False" and shape == "(1, 384)"
    assert np.allclose(
        LocalEmbedder(background=True).embed(["Ada Lovelace"]), LocalEmbedder().embed(["Ada Lovelace"]), atol=1e-6
    )
