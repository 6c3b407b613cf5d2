# syntax=docker/dockerfile:1
# The oomsight image: the pod sidecar (`oomsight sidecar`), the admission webhook
# (`oomsight webhook`) and the zero-code init container (`oomsight install-startup`).
# No torch inside (the training image brings its own); nothing is downloaded at run time.
# `docker build .` builds it from python:*-slim and PyPI. scripts/build-image.sh builds it with
# podman and no registry or network (a local Debian base as PYTHON_IMAGE; pip's wheels and its
# config mounted at build time only); tests/test_image.py runs that image read-only, non-root.

ARG PYTHON_IMAGE=python:3.12.8-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VENV=/opt/oomsight
WORKDIR /src
COPY pyproject.toml ./
COPY exporter/ exporter/
COPY server/ server/
COPY sidecar/ sidecar/
COPY webhook/ webhook/
RUN python -m venv "${VENV}" \
    && "${VENV}/bin/pip" install --no-cache-dir ".[sidecar]" \
    && "${VENV}/bin/pip" uninstall --yes pip

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="oomsight" \
      org.opencontainers.image.description="oomsight sidecar and admission webhook: see why PyTorch runs out of CUDA memory" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/oomsight/oomsight"
COPY --from=build /opt/oomsight /opt/oomsight
# In a container the sidecar listens on every interface of its own network namespace
# (`oomsight sidecar` run by hand elsewhere defaults to 127.0.0.1; the webhook sets it too).
ENV PATH=/opt/oomsight/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    OOMSIGHT_DIR=/var/run/oomsight \
    OOMSIGHT_SIDECAR_HOST=0.0.0.0
# A fixed non-root user (the chart and the webhook run everything as 65532:65532).
USER 65532:65532
EXPOSE 21400 21401 21443
ENTRYPOINT ["oomsight"]
CMD ["sidecar"]
