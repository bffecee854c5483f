"""Clients of the inference service. `clients.cli` is the `inference-client` command."""
