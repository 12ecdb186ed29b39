#!/usr/bin/env bash
# Fetches the JavaScript that `accumcheck report` inlines into its HTML
# (uPlot, MIT, from the npm registry) into third_party/npm/, pinned by
# version and SHA-256.  Idempotent: a present, verified tarball is kept and
# the network is not touched.  Called by scripts/setup.sh and, when the
# tarball is missing, by CMake at configure time.
set -euo pipefail
cd "$(dirname "$0")/.."
name=uplot version=1.6.32
sha256=4b8a8191e425658e3ea8c8c1314b0fc679c861ee3a1af2b20c7b16ba50b5133d
dest=third_party/npm/$name-$version.tgz
verify() { echo "$sha256  $1" | sha256sum --check --status; }
if [ -f "$dest" ] && verify "$dest"; then exit 0; fi
command -v npm >/dev/null || { echo "vendor_js: npm is missing (apt-get install npm)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "$name@$version" >/dev/null 2>&1) ||
  { echo "vendor_js: npm pack $name@$version failed (is the npm registry reachable?)" >&2; exit 1; }
verify "$tmp/$name-$version.tgz" ||
  { echo "vendor_js: $name-$version.tgz does not have the pinned SHA-256" >&2; exit 1; }
mkdir -p third_party/npm
mv "$tmp/$name-$version.tgz" "$dest"
echo "vendor_js: $dest"
