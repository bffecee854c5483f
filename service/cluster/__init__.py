"""Many replicas behind Envoy: the endpoint picker that Envoy asks where each
request should go (`picker`), what it knows of the replicas (`replicas`), of the
prompts it routed (`prefix_table`), how it ranks them (`ranking`), what it
exports to Prometheus (`metrics`), the Envoy configuration (`envoy_config`) and
the launcher behind `make cluster` (`launcher`)."""
