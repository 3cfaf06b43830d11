"""The shared embedding cache in Redis: a text is encoded once across workers and runs."""

import asyncio
import uuid

import numpy as np

from store import Memory
from workers.models.embedding import BatchingEmbedder


class CountingEmbedder:
    """Test double: deterministic vectors, counts the texts it is asked to encode."""

    dims = 4

    def __init__(self):
        self.name = f"counting-{uuid.uuid4().hex[:6]}"
        self.encoded: list[str] = []

    def embed(self, texts):
        self.encoded += texts
        return np.array([[len(t), 1, 0, 0] for t in texts], dtype=np.float32)


def test_second_embedder_reads_vectors_from_redis_instead_of_the_model(stack_env):
    async def run():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"])
        first, model = None, CountingEmbedder()
        try:
            first = await BatchingEmbedder(model, cache=memory.embedding_cache(model.name)).embed(
                ["alpha", "beta", "alpha"]
            )
            other_model = CountingEmbedder()
            other_model.name = model.name  # another worker process with the same model
            again = await BatchingEmbedder(other_model, cache=memory.embedding_cache(other_model.name)).embed(
                ["beta", "alpha", "gamma"]
            )
            return model.encoded, other_model.encoded, first, again
        finally:
            await memory.close()

    encoded_first, encoded_second, first, again = asyncio.run(run())
    assert encoded_first == ["alpha", "beta"] and encoded_second == ["gamma"]
    assert np.array_equal(first[0], first[2]) and np.array_equal(again[1], first[0]) and again[2][0] == 5
