# syntax=docker/dockerfile:1
# MARLaaS container image: every service and the command-line client in one image; the command
# picks what runs (deploy/docker/entrypoint.sh):
#   docker run IMAGE scheduler | rollout | verifier | trainer [flags]
#   docker run IMAGE marlaas ARGS        (also: reward_service, env_service, probe PORT [PATH])
#
#   docker build -t marlaas:cpu .                              CPU backend (OpenBLAS)
#   docker build -t marlaas:cuda --build-arg BACKEND=cuda .    CUDA build, for GPU nodes
#   --build-arg ARCH=x86-64-v3 (or native, ...)                optional: by default the binaries are
#                                                              built for the x86-64 baseline and run
#                                                              on any x86-64 server, their CPU kernels
#                                                              choosing AVX-512 or AVX2 at run time
#
# Stages (BuildKit, the default builder since Docker 23, builds only those the target needs):
# build-cpu / build-cuda compile with Debian bookworm's -dev packages (CUDA: NVIDIA's Debian 12
# repository); runtime-cpu / runtime-cuda are debian:bookworm-slim plus only the shared
# libraries the binaries load. The package lists are roles of scripts/packages.txt (the one list
# of the project's Debian packages), and tests/integration/test_deploy.sh checks the "image" role
# against the binaries' DT_NEEDED entries, so a new library cannot be forgotten and none ships
# unused.
ARG BACKEND=cpu

# --- build ------------------------------------------------------------------------------------
FROM debian:bookworm AS build-cpu
ENV DEBIAN_FRONTEND=noninteractive
COPY scripts/packages.txt scripts/packages.sh /tmp/
RUN apt-get update \
 && apt-get install -y --no-install-recommends $(sh /tmp/packages.sh build image-build) \
 && rm -rf /var/lib/apt/lists/*

FROM build-cpu AS build-cuda
COPY deploy/docker/cuda-repo.sh /tmp/
RUN sh /tmp/cuda-repo.sh \
 && apt-get install -y --no-install-recommends $(sh /tmp/packages.sh cuda-build) \
 && rm -rf /var/lib/apt/lists/*
ENV PATH=/usr/local/cuda/bin:$PATH

FROM build-${BACKEND} AS build
ARG BACKEND
# -march for the code outside the CPU kernel variants (the Makefile's ARCH); empty: none
ARG ARCH=
WORKDIR /src
COPY . .
# The packages are installed above: the stamp tells the Makefile not to run its installer.
RUN set -eu; \
    cuda=0; out=build/bin; \
    if [ "$BACKEND" = cuda ]; then cuda=1; out=build/cuda/bin; fi; \
    bins="marlaas marlaas-scheduler marlaas-rollout marlaas-verifier marlaas-trainer reward_service env_service"; \
    rm -rf build && mkdir -p build && touch build/.deps-ok; \
    make -j"$(nproc)" ARCH="$ARCH" CUDA="$cuda" $(for b in $bins; do echo "$out/$b"; done); \
    mkdir -p /out; \
    for b in $bins; do cp "$out/$b" /out/; done

# --- runtime ----------------------------------------------------------------------------------
FROM debian:bookworm-slim AS runtime-cpu
ENV DEBIAN_FRONTEND=noninteractive
COPY scripts/packages.txt scripts/packages.sh /tmp/
RUN apt-get update \
 && apt-get install -y --no-install-recommends $(sh /tmp/packages.sh image) \
 && rm -rf /var/lib/apt/lists/* /tmp/packages.txt /tmp/packages.sh

FROM runtime-cpu AS runtime-cuda
COPY --from=build-cuda /usr/share/keyrings/cuda-archive-keyring.gpg /usr/share/keyrings/
COPY --from=build-cuda /etc/apt/sources.list.d/cuda-debian12-x86_64.list /etc/apt/sources.list.d/
COPY scripts/packages.txt scripts/packages.sh /tmp/
RUN apt-get update \
 && apt-get install -y --no-install-recommends $(sh /tmp/packages.sh cuda-image) \
 && rm -rf /var/lib/apt/lists/* /tmp/packages.txt /tmp/packages.sh
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility

FROM runtime-${BACKEND}
COPY --from=build /out/ /usr/local/bin/
COPY deploy/docker/entrypoint.sh /usr/local/bin/marlaas-entrypoint
COPY models /opt/marlaas/models
RUN useradd --system --uid 10001 --no-create-home --home-dir /opt/marlaas marlaas
USER 10001
WORKDIR /opt/marlaas
ENV MARLAAS_MODEL=/opt/marlaas/models/tiny
# API, work, events, reports (scheduler); verifiers; trainer, trainer events; HTTP of each service
EXPOSE 7000 7001 7002 7003 7010 7020 7021 9500 9501 9502 9503
ENTRYPOINT ["/usr/local/bin/marlaas-entrypoint"]
CMD ["marlaas", "--help"]
