# The memstream worker image (used by docker-compose.yml).
FROM python:3.11-slim
ENV HF_HUB_OFFLINE=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY topics topics
COPY store store
COPY workers workers
COPY ops ops
RUN pip install .
ENTRYPOINT []
CMD ["memstream", "worker"]
