#!/usr/bin/env bash
# Install Debian packages (no recommends, quietly) without starting their services:
#   scripts/apt-install.sh PACKAGE...
# A package's postinst starts its service through invoke-rc.d (sysvinit) or
# deb-systemd-invoke (systemd); both ask /usr/sbin/policy-rc.d first, and an answer of 101
# ("action forbidden") is Debian's standard way to install without starting anything
# (invoke-rc.d(8)). The tests start their own servers, so where no policy-rc.d exists a
# forbidding one is put in place for the install and removed afterwards; a machine's own
# policy-rc.d is left as it is. Nothing is stopped or killed afterwards.
# Root, or sudo without a password, is needed. apt-get update runs only if the install fails.
set -euo pipefail
[ "$#" -gt 0 ] || { echo "usage: $0 PACKAGE..." >&2; exit 2; }
POLICY=/usr/sbin/policy-rc.d
MARK="# written by oomsight scripts/apt-install.sh"

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo -n "$@"; else
    echo "apt-install: need root (or sudo) to run: $*" >&2; return 1; fi
}

remove_policy() {
  if grep -qxF "$MARK" "$POLICY" 2>/dev/null; then as_root rm -f "$POLICY"; fi
}

if [ ! -e "$POLICY" ]; then
  trap remove_policy EXIT
  printf '#!/bin/sh\n%s\nexit 101\n' "$MARK" | as_root tee "$POLICY" >/dev/null
  as_root chmod 0755 "$POLICY"
fi
apt_get() { as_root env DEBIAN_FRONTEND=noninteractive apt-get -y -q "$@"; }
echo "apt-install: installing Debian packages $*" >&2
apt_get install --no-install-recommends "$@" >/dev/null 2>&1 || {
  apt_get update >/dev/null
  apt_get install --no-install-recommends "$@" >/dev/null
}
