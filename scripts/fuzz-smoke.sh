#!/usr/bin/env bash
# Runs every fuzz target for a short, fixed time (FUZZ_SECONDS, default 5) on stable Rust
# (`--sanitizer none`), installing cargo-fuzz if it is missing. Long runs:
#   cargo fuzz run -s none -O -a TARGET -- -max_total_time=600
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-5}"
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
cargo fuzz build -s none -O -a
for target in $(cargo fuzz list); do
  echo "fuzz: $target for ${seconds}s"
  # A scratch corpus dir: new inputs found by the smoke run are not committed.
  work="$(mktemp -d)"
  cp fuzz/corpus/"$target"/* "$work"/
  cargo fuzz run -s none -O -a "$target" "$work" -- -max_total_time="$seconds" 2>&1 | grep -E '^(Done|#[0-9]+ +DONE)|panicked|SUMMARY|ERROR' || true
  rm -rf "$work"
  if ls fuzz/artifacts/"$target"/crash-* >/dev/null 2>&1; then
    echo "fuzz: $target found a failing input: fuzz/artifacts/$target/" >&2
    exit 1
  fi
done
