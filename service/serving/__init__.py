"""Serving one RPC end to end: the model from the pool, the work from its engine."""
