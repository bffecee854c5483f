"""Embed's requests and results, and the embedding backends' contract (the batching of
concurrent requests is the engine's: service.engine.embedding_queue)."""
