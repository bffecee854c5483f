"""Python stubs generated from protos/ by `make protos`. Do not edit."""
