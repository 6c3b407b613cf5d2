#!/usr/bin/env bash
# Build the Dockerfile into a real image with podman, with no image registry and no network
# inside the build (docs/kubernetes.md, "The image"; tests/test_image.py runs the result):
#   scripts/build-image.sh [--store DIR] [--tag NAME]
# - base: the Debian image scripts/install-image-tools.sh makes (run first, idempotent),
#   imported into the store and passed as the Dockerfile's PYTHON_IMAGE;
# - wheels: downloaded by pip on this machine for the base's Python, glibc and CPU, and
#   cached in .tools/image/wheels-py<X.Y>; the build's RUN steps see them read-only at
#   /wheels, with an /etc/pip.conf of no-index + find-links mounted beside them (build-time
#   mounts, not part of the Dockerfile, so `docker build .` stays the normal build);
# - context: a temporary folder holding what the Dockerfile's COPY lines name (a missing
#   folder becomes an empty one), so the build does not depend on the tree's other files;
# - runtime runc, not crun, and default ulimits set: crun's setrlimit and cgroup handling
#   fail in sandboxes such as the CI machine's.
# DIR (default $OOMSIGHT_IMAGE_STORE, else ${TMPDIR:-/tmp}/oomsight-image) holds the storage
# and podman's configuration; run the image with the same configuration:
#   CONTAINERS_CONF=DIR/containers.conf CONTAINERS_STORAGE_CONF=DIR/storage.conf podman run ...
# Prints the image's name on stdout, progress on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
STORE="${OOMSIGHT_IMAGE_STORE:-${TMPDIR:-/tmp}/oomsight-image}"
TAG="localhost/oomsight:$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n1)"
while [ "$#" -gt 0 ]; do
  case "$1" in
    --store) STORE="$2"; shift 2 ;;
    --tag) TAG="$2"; shift 2 ;;
    *) echo "usage: $0 [--store DIR] [--tag NAME]" >&2; exit 2 ;;
  esac
done
say() { echo "build-image: $*" >&2; }

bash scripts/install-image-tools.sh
# shellcheck source=/dev/null
. .tools/image/base.env

mkdir -p "$STORE"
STORE="$(cd "$STORE" && pwd)"
cat >"$STORE/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "$STORE/tmp"
CONF
cat >"$STORE/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$STORE/storage"
runroot = "$STORE/run"
CONF
export CONTAINERS_CONF="$STORE/containers.conf" CONTAINERS_STORAGE_CONF="$STORE/storage.conf"

BASE="localhost/oomsight-base:$BASE_SUITE"
stamp="$(stat -c %Y "$BASE_TARBALL")"
if [ "$(podman image inspect --format '{{index .Labels "oomsight.base.mtime"}}' "$BASE" 2>/dev/null)" != "$stamp" ]; then
  say "importing $BASE_TARBALL as $BASE"
  podman import --quiet \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change "LABEL oomsight.base.mtime=$stamp" \
    "$BASE_TARBALL" "$BASE" >/dev/null
fi

# the project's requirements (build system, base, sidecar extra) as wheels for the image's Python
PY="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
WHEELS="$PWD/.tools/image/wheels-py$BASE_PYTHON"
mkdir -p "$WHEELS"
"$PY" - >"$STORE/requirements.txt" <<'PYTHON'
import tomllib
with open("pyproject.toml", "rb") as fh:
    project = tomllib.load(fh)
for requirement in (
    project["build-system"]["requires"] + project["project"]["dependencies"]
    + project["project"]["optional-dependencies"]["sidecar"]
):
    print(requirement)
PYTHON
arch="$(uname -m)"
platforms=(--platform "manylinux2014_$arch")  # pip adds manylinux2010 and manylinux1
for ((minor = 17; minor <= ${BASE_GLIBC#2.}; minor++)); do platforms+=(--platform "manylinux_2_${minor}_$arch"); done
say "downloading wheels for Python $BASE_PYTHON, glibc $BASE_GLIBC, $arch into $WHEELS"
"$PY" -m pip download --quiet --disable-pip-version-check --dest "$WHEELS" --only-binary=:all: \
  --implementation cp --python-version "$BASE_PYTHON" "${platforms[@]}" -r "$STORE/requirements.txt"
printf '[global]\nno-index = true\nfind-links = /wheels\n' >"$STORE/pip.conf"

# the build context: what the Dockerfile copies, and nothing else
context="$STORE/context"
rm -rf "$context"
mkdir -p "$context"
cp Dockerfile .dockerignore "$context/"
awk 'toupper($1) == "COPY" && $2 !~ /^--/ { for (i = 2; i < NF; i++) print $i }' Dockerfile | while read -r source; do
  if [ -e "$source" ]; then
    cp -r "${source%/}" "$context/"
  elif [ "${source%/}" != "$source" ]; then
    say "$source is not in this tree: an empty folder stands in"
    mkdir -p "$context/$source"
  else
    say "the Dockerfile copies $source, which is missing"; exit 1
  fi
done

say "building $TAG (network none, runtime runc)"
start=$SECONDS
podman build --quiet --pull=never --isolation oci --runtime runc --network none \
  --build-arg "PYTHON_IMAGE=$BASE" \
  --volume "$WHEELS:/wheels:ro" --volume "$STORE/pip.conf:/etc/pip.conf:ro" \
  --tag "$TAG" --file "$context/Dockerfile" "$context" >/dev/null
size="$(podman image inspect --format '{{.Size}}' "$TAG")"
say "built $TAG in $((SECONDS - start)) s: $((size / 1000000)) MB"
echo "$TAG"
