"""Pure algorithms: text normalisation and ids, chunking, the conflict policy, the retrieval
seeding and the sparse PPR. Nothing here does I/O or imports a client; each has reference tests."""
