#!/usr/bin/env bash
# Installs what the tests need and a fresh machine (Rust only) lacks. Idempotent.
set -euo pipefail

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need_apt+=(redis-tools)
# The tower layer's load test (scripts/load.sh).
command -v wrk >/dev/null 2>&1 || need_apt+=(wrk)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  echo "installing ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
  # The Debian package starts a system redis on 6379; tests start their own servers.
  $SUDO service redis-server stop >/dev/null 2>&1 || true
fi
# Miri (nightly), for the word table's `unsafe` slot keys; scripts/test.sh runs it unless FAST=1.
if [ "${FAST:-0}" != 1 ] && ! cargo +nightly miri --version >/dev/null 2>&1; then
  rustup toolchain install nightly --profile minimal --component miri,rust-src
fi
# The public API snapshot's tool (scripts/public-api.sh; nightly rustdoc JSON). Pinned: its
# output is what tests/public-api.txt is compared with.
if [ "${FAST:-0}" != 1 ] && ! cargo public-api --version 2>/dev/null | grep -q ' 0\.52\.0'; then
  cargo install cargo-public-api --version 0.52.0 --locked
fi
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
