"""The query side: the engine (dense and memory-guided PPR over a cached graph), the graph
cache, answer generation and the HTTP server — which needs Redis only, never Kafka."""
