#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages the demo or the tests need, when run as root with apt.
# Usage: tools/install-system-packages.sh demo|test
# Otherwise it names what is missing and how to get it, and exits 1.
set -euo pipefail

case "${1:-test}" in
  demo) packages=(gcc) ;;
  test) packages=(gcc pkg-config libsystemd-dev systemd systemd-journal-remote procps prometheus
                  prometheus-node-exporter prometheus-alertmanager chromium chromium-driver cmake g++
                  golang-go golang-github-masterminds-sprig-dev golang-github-ghodss-yaml-dev
                  golang-github-xeipuuv-gojsonschema-dev) ;;  # the last four: tools/helm-render
  *) echo "usage: $0 demo|test" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  echo "installing Debian packages: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Debian's prometheus packages start their services on install; we only want the binaries.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "missing system packages: ${missing[*]}" >&2
  echo "install them first, e.g.: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
