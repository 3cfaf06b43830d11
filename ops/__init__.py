"""Operations: CLI, local stack, topic admin, benchmarks."""
