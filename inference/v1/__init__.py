"""Python stubs generated from protos/ by `make protos`. Do not edit.

Beside them, `inference.binpb`: the contract's descriptor set with its imports (what
Envoy's gRPC-JSON transcoder reads), as package data:
`importlib.resources.files("inference.v1") / "inference.binpb"`.
"""
