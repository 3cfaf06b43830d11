"""memstream workers: the faust app, its agents, extraction, embedding and retrieval."""
