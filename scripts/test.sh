#!/usr/bin/env bash
# Runs every test tollgate has, installing what a fresh machine lacks first.
#   bash scripts/test.sh            everything (lint, rustdoc, package, unit, integration, doc
#                                   tests, public API snapshot, Miri, loom, load smoke, fuzz smoke)
#   FAST=1 bash scripts/test.sh     skip the API snapshot, Miri, loom, the load smoke and fuzz
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
if [ "${CI:-}" = true ]; then
  # A fresh clone gains nothing from incremental builds, and they double the disk a CI run needs.
  export CARGO_INCREMENTAL=0
  # CI reads backtraces, not a debugger: line tables in test builds, no debug info in release
  # ones (the flood test, the loom models, fuzzing), which shortens every link.
  export CARGO_PROFILE_DEV_DEBUG=line-tables-only CARGO_PROFILE_RELEASE_DEBUG=0
fi

step() { printf '\n==> [%s] %s\n' "$(date +%T)" "$*"; }

step "install what is missing"
bash scripts/install-deps.sh

step "format and lint"
cargo fmt --all -- --check
cargo clippy --all-targets --all-features -- -D warnings
# The `tollgate` command, a workspace crate of its own (`cli/`), `replay --redis` included.
cargo clippy -p tollgate-cli --all-targets --all-features -- -D warnings
# Code gated by a feature must also be clean without its neighbours: the core alone, and
# the tower layer without metrics, serde or redis, and the actix middleware on it alone.
cargo clippy --lib -- -D warnings
cargo clippy --lib --features tower -- -D warnings
cargo clippy --lib --features actix -- -D warnings
# The library's files as the loom models compile them (against loom's atomics).
cargo clippy -p tollgate-loom-tests --lib --test models -- -D warnings

# Right after clippy: rustdoc reuses the dependencies' check builds clippy just made.
step "documentation: every feature, rustdoc warnings are errors (broken links, missing docs)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --all-features

step "package: the files a publish would upload, and that they build on their own"
bash scripts/package-check.sh

step "unit, integration and doc tests (all features)"
cargo test --all-features
step "the tollgate command (cli/): replay, --config, --plot, --redis"
cargo test -p tollgate-cli --all-features

step "hostile flood: 10M unique keys against max_keys = 100000 (release)"
cargo test --release --test flood
step "keys with drop glue grown to 40k-400k, evicted and dropped: nothing held after (release)"
cargo test --release --test key_drop

if [ "${FAST:-0}" != 1 ]; then
  step "public API: unchanged from tests/public-api.txt (bash scripts/public-api.sh --bless after a deliberate change)"
  bash scripts/public-api.sh
  step "Miri, two runs at once (one a core): the word table's unsafe slot keys (written, read, moved, dropped once, also when a key's code panics; String keys inline) and its mapped tables; then, under Tree Borrows, leaks not checked, the sliding log's cell, its heap rings replaced and freed by epoch"
  # Tree Borrows: crossbeam-epoch is not Stacked Borrows clean, and its maintainers run Miri
  # under Tree Borrows; its global collector may still hold deferred frees and exited threads'
  # records when the process ends. Miri interprets on one thread, so two runs take both cores.
  cargo +nightly miri test --lib --no-run
  miri_logs="$(mktemp -d)"
  ( cargo +nightly miri test --lib -- keys_are_written_read_moved_and_dropped_once \
      keys_that_panic_are_never_dropped_twice_nor_lost a_large_region_is_mapped_zeroed \
      a_mapped_table_is_written_moved_and_freed &&
    MIRIFLAGS="-Zmiri-tree-borrows -Zmiri-ignore-leaks" cargo +nightly miri test --lib -- state::log
  ) >"$miri_logs/slots" 2>&1 &
  slots=$!
  cargo +nightly miri test --lib -- string_keys word_table::text \
    keys_of_every_size_and_cell_are_dropped_once_on_every_path >"$miri_logs/keys" 2>&1 &
  keys=$!
  slots_rc=0 keys_rc=0
  wait "$slots" || slots_rc=$?
  wait "$keys" || keys_rc=$?
  cat "$miri_logs/slots" "$miri_logs/keys"
  rm -rf "$miri_logs"
  if [ "$slots_rc" != 0 ] || [ "$keys_rc" != 0 ]; then
    echo "Miri failed (exit codes $slots_rc, $keys_rc: output above)" >&2
    exit 1
  fi
  if [ -d loom-tests ]; then
    step "loom models (bounded preemption)"
    LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}" \
      cargo test --release -p tollgate-loom-tests
  fi
  step "load smoke: wrk for 2 s against each of the example servers (scripts/load.sh)"
  LOAD_SECONDS=2 ROUNDS=1 bash scripts/load.sh
  if [ -x scripts/fuzz-smoke.sh ]; then
    step "fuzz smoke"
    bash scripts/fuzz-smoke.sh
  fi
fi
step "all tests passed"
