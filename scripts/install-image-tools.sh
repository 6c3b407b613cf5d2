#!/usr/bin/env bash
# What the real image build (scripts/build-image.sh, tests/test_image.py) needs, with no image
# registry: the Debian packages podman, runc and mmdebstrap, and a Debian base image made
# locally by mmdebstrap (python3, python3-venv, ca-certificates; no docs, man pages or locales)
# from the Debian archive and security mirrors this machine's apt sources name.
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

OWN="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"

configured_uri() {  # configured_uri SUITE: the first URI this machine's apt sources give for SUITE
  local file
  for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    if [ -f "$file" ]; then cat "$file"; fi
    echo  # a deb822 stanza ends with its file
  done | awk -v want="$1" '
    function check(uris, suites,   n, s, i, u) {
      n = split(suites, s, " ")
      for (i = 1; i <= n; i++) if (s[i] == want) { split(uris, u, " "); print u[1]; found = 1; exit }
    }
    /^[ \t]*deb[ \t]/ { line = $0; sub(/\[[^]]*\]/, "", line); split(line, f, " "); check(f[2], f[3]); next }
    /^URIs:/ { uris = $0; sub(/^URIs:[ \t]*/, "", uris) }
    /^Suites:/ { suites = $0; sub(/^Suites:[ \t]*/, "", suites) }
    /^[ \t]*$/ { if (uris != "" && suites != "") check(uris, suites); uris = suites = "" }
    END { if (!found && uris != "" && suites != "") check(uris, suites) }'
}

mirrors() {  # mirrors SUITE: apt lines for SUITE from this machine's mirrors; none: mmdebstrap's defaults
  local archive security
  archive="$(configured_uri "$OWN")"
  security="$(configured_uri "$OWN-security")"
  [ -n "$archive" ] || return 0
  printf '%s\n' "deb $archive $1 main" "deb $archive $1-updates main"
  if [ -n "$security" ]; then printf '%s\n' "deb $security $1-security main"; fi
}

make_base() {  # make_base SUITE: writes base-SUITE.tar and base-SUITE.env, or fails
  local suite="$1" tarball="$CACHE/base-$1.tar" python glibc
  local -a sources
  mapfile -t sources < <(mirrors "$suite")
  echo "install-image-tools: making the Debian $suite base image with mmdebstrap" \
    "(${sources[*]:-the default mirrors of mmdebstrap})" >&2
  rm -f "$tarball.part"
  mmdebstrap --quiet --variant=essential --format=tar \
    --include=python3,python3-venv,python-is-python3,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
    "$suite" "$tarball.part" "${sources[@]}" >&2 || { rm -f "$tarball.part"; return 1; }
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
  [ -n "$OWN" ] && [ "$OWN" != "$SUITE" ] || exit 1
  echo "install-image-tools: no $SUITE base; using this machine's suite $OWN" >&2
  SUITE="$OWN"
  fresh "$SUITE" || make_base "$SUITE"
fi
cp "$CACHE/base-$SUITE.env" "$CACHE/base.env"
# shellcheck source=/dev/null
. "$CACHE/base.env"
echo "install-image-tools: base image Debian $BASE_SUITE, Python $BASE_PYTHON, glibc $BASE_GLIBC" \
  "($(du -m "$BASE_TARBALL" | cut -f1) MB)" >&2
