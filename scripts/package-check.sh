#!/usr/bin/env bash
# What `cargo publish` would upload, checked before anyone publishes:
#   - the files the crate's own docs need are in the package (rustdoc includes
#     docs/decision-rules.md; README shows docs/api.svg, links docs/*.md and quotes two
#     examples, which tests/readme.rs compares with README);
#   - no published text points outside the repository: no path into the private sibling folder `shared` and no
#     markdown or rustdoc link to a web page (the docs must read the same offline, on docs.rs
#     and in a downloaded crate);
#   - the packaged crate builds on its own (`cargo package` verifies: a fresh build of the
#     extracted tarball, default features, ~30 s on 2 cores).
# Works on a fresh clone, whether or not the sibling folder `shared` exists: nothing here reads it.
set -euo pipefail
cd "$(dirname "$0")/.."

# --allow-dirty: a local run with uncommitted edits checks what is on disk, as CI's clean
# clone does.
list=$(cargo package --list --allow-dirty 2>/dev/null)

missing=0
for f in Cargo.toml README.md CHANGELOG.md CONTRIBUTING.md src/lib.rs \
         docs/decision-rules.md docs/design.md docs/choosing.md docs/api.svg docs/boundary.svg \
         docs/tower.md docs/security.md docs/cli.md docs/redis.md \
         examples/quickstart.rs examples/in_process.rs tests/readme.rs; do
  if ! grep -qx "$f" <<<"$list"; then
    echo "package-check: $f is not in the package" >&2
    missing=1
  fi
done

# Text files of the package; links are searched in markdown and in Rust sources (rustdoc).
mapfile -t text < <(grep -E '\.(md|rs|toml|sh)$' <<<"$list" | grep -vx 'Cargo.toml.orig' || true)
bad=0
private='..''/shared'   # spelled in two pieces so that this file does not match itself
if grep -nF "$private" "${text[@]}"; then
  echo "package-check: published files above name $private, which is private" >&2
  bad=1
fi
# A markdown link or autolink to a web page: `](http…` or `<http…>`. Plain URLs of local servers
# in shell examples (curl http://127.0.0.1:3000/…) are not links.
if grep -nE '\]\(https?://|<https?://' "${text[@]}"; then
  echo "package-check: published files above link outside the repository" >&2
  bad=1
fi
[ "$missing" = 0 ] && [ "$bad" = 0 ] || exit 1

cargo package --allow-dirty --quiet
echo "package-check: $(wc -l <<<"$list") files, builds on its own"
