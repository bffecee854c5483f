"""The front: the process clients talk to. It holds no model; engines do.

`server` wires the process (the grpc.aio server, health, reflection, the pool,
the metrics and OpenAI HTTP ports; `python -m service.front` runs it), with the
port's options and TLS from `transport`. Each RPC passes, in order: `registration`
(large requests handed over still encoded), `rpc` (request id, bearer token from
`auth`, decoding off the loop on `offload`'s pool, errors to statuses, one log
line, `metrics`), the `servicer` (the request `limits`, `conversion` to a
validated request, the `overload` gate), then service.serving. `openai_api` does
the same for HTTP clients, into the servicer below its gRPC wrapper.
"""
