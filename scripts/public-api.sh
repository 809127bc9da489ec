#!/usr/bin/env bash
# The crate's public API (every feature), as cargo-public-api lists it, against the snapshot in
# tests/public-api.txt: a change to what users can call, name or implement shows in review.
#   bash scripts/public-api.sh           fails, with the diff, if the API changed
#   bash scripts/public-api.sh --bless   rewrites the snapshot (a deliberate change)
# Needs the nightly toolchain (rustdoc JSON) and cargo-public-api (scripts/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
snapshot=tests/public-api.txt
now=$(mktemp)
trap 'rm -f "$now"' EXIT
cargo public-api -sss --all-features > "$now"
if [ "${1:-}" = --bless ]; then
  cp "$now" "$snapshot"
  echo "wrote $snapshot ($(wc -l < "$snapshot") lines)"
elif ! diff -u "$snapshot" "$now"; then
  echo "the public API changed: if that is deliberate, run bash scripts/public-api.sh --bless" >&2
  exit 1
fi
