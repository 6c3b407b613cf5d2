#!/usr/bin/env bash
# What the real image build (scripts/build-image.sh, tests/test_image.py) needs, with no image
# registry: the Debian packages podman, runc and mmdebstrap, and a Debian base image made
# locally by mmdebstrap (python3, python3-venv, ca-certificates; no docs, man pages or locales).
# The base is cached as .tools/image/base-<suite>.tar and remade after 30 days (security
# updates); .tools/image/base.env names the tarball, its Python and its glibc for the build.
#   OOMSIGHT_IMAGE_SUITE   Debian suite of the base (default trixie; the machine's own suite
#                          is used where mmdebstrap cannot make trixie)
# Idempotent: a second run with everything in place only checks. Root (or sudo) for apt.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="$PWD/.tools/image"
SUITE="${OOMSIGHT_IMAGE_SUITE:-trixie}"
PACKAGES=(podman runc mmdebstrap)
mkdir -p "$CACHE"

missing=()
for program in "${PACKAGES[@]}"; do
  command -v "$program" >/dev/null || [ -x "/usr/sbin/$program" ] || missing+=("$program")  # runc is in sbin
done
if [ "${#missing[@]}" -gt 0 ]; then bash scripts/apt-install.sh "${missing[@]}"; fi

make_base() {  # make_base SUITE: writes base-SUITE.tar and base-SUITE.env, or fails
  local suite="$1" tarball="$CACHE/base-$1.tar" python glibc
  echo "install-image-tools: making the Debian $suite base image with mmdebstrap" >&2
  rm -f "$tarball.part"
  mmdebstrap --quiet --variant=essential --format=tar \
    --include=python3,python3-venv,python-is-python3,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
    "$suite" "$tarball.part" >&2 || { rm -f "$tarball.part"; return 1; }
  # the image's Python (X.Y) and glibc (2.N) decide which wheels the build may use
  python="$(tar -tf "$tarball.part" | sed -n 's|^\./usr/bin/python\(3\.[0-9]*\)$|\1|p' | head -n1)"
  glibc="$(tar -xOf "$tarball.part" ./var/lib/dpkg/status \
    | awk '/^Package: libc6$/ { found = 1 } found && /^Version:/ { sub(/-.*/, "", $2); print $2; exit }')"
  if [ -z "$python" ] || [ -z "$glibc" ]; then
    echo "install-image-tools: the $suite base has no python3.X or no libc6" >&2
    rm -f "$tarball.part"
    return 1
  fi
  printf 'BASE_SUITE=%s\nBASE_TARBALL=.tools/image/base-%s.tar\nBASE_PYTHON=%s\nBASE_GLIBC=%s\n' \
    "$suite" "$suite" "$python" "$glibc" >"$CACHE/base-$suite.env"
  mv "$tarball.part" "$tarball"
}

fresh() {
  [ -s "$CACHE/base-$1.tar" ] && [ -s "$CACHE/base-$1.env" ] && [ -z "$(find "$CACHE/base-$1.tar" -mtime +30)" ]
}

if ! fresh "$SUITE" && ! make_base "$SUITE"; then
  own="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
  [ -n "$own" ] && [ "$own" != "$SUITE" ] || exit 1
  echo "install-image-tools: no $SUITE base; using this machine's suite $own" >&2
  SUITE="$own"
  fresh "$SUITE" || make_base "$SUITE"
fi
cp "$CACHE/base-$SUITE.env" "$CACHE/base.env"
# shellcheck source=/dev/null
. "$CACHE/base.env"
echo "install-image-tools: base image Debian $BASE_SUITE, Python $BASE_PYTHON, glibc $BASE_GLIBC" \
  "($(du -m "$BASE_TARBALL" | cut -f1) MB)" >&2
