"""Model clients behind small Protocols (`workers.models.protocols`): the chat model (any
OpenAI-compatible endpoint), the embedder, the extractors; every prompt in `prompts`."""
