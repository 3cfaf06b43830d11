"""The shared embedding cache in Redis: a text is encoded once across workers and runs."""

import asyncio
import uuid

import numpy as np
import redis.asyncio as aioredis

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
        client = aioredis.from_url(stack_env["MEMSTREAM_REDIS_URL"])
        first, model = None, CountingEmbedder()
        try:
            first = await BatchingEmbedder(model, redis=client).embed(["alpha", "beta", "alpha"])
            other_model = CountingEmbedder()
            other_model.name = model.name  # another worker process with the same model
            again = await BatchingEmbedder(other_model, redis=client).embed(["beta", "alpha", "gamma"])
            return model.encoded, other_model.encoded, first, again
        finally:
            await client.aclose()

    encoded_first, encoded_second, first, again = asyncio.run(run())
    assert encoded_first == ["alpha", "beta"] and encoded_second == ["gamma"]
    assert np.array_equal(first[0], first[2]) and np.array_equal(again[1], first[0]) and again[2][0] == 5
