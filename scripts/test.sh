#!/usr/bin/env bash
# Runs every test tollgate has, installing what a fresh machine lacks first.
#   bash scripts/test.sh            everything (lint, unit, integration, doc, loom, fuzz smoke)
#   FAST=1 bash scripts/test.sh     skip loom and fuzz
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

step() { printf '\n==> %s\n' "$*"; }

step "install what is missing"
bash scripts/install-deps.sh

step "format and lint"
cargo fmt --all -- --check
cargo clippy --all-targets --all-features -- -D warnings

step "unit, integration and doc tests (all features)"
cargo test --all-features

step "hostile flood: 10M unique keys against max_keys = 100000 (release)"
cargo test --release --test flood

if [ "${FAST:-0}" != 1 ]; then
  if [ -d loom-tests ]; then
    step "loom models (bounded preemption)"
    LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}" \
      cargo test --release -p tollgate-loom-tests
  fi
  if [ -x scripts/fuzz-smoke.sh ]; then
    step "fuzz smoke"
    bash scripts/fuzz-smoke.sh
  fi
fi
step "all tests passed"
