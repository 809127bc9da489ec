#!/usr/bin/env bash
# The load test of the tower layer: wrk against the example's router on loopback,
# 10,000 client IPs in X-Forwarded-For from the trusted 127.0.0.1 (benches/load/xff.lua), for
# four servers (examples/load_server.rs): no layer, the tollgate layer, the tollgate layer
# without its rate-limit header fields, tower-governor.
#   bash scripts/load.sh                   10 s a server, 2 rounds, the servers alternating
#   LOAD_SECONDS=2 ROUNDS=1 bash scripts/load.sh   a smoke run (what CI runs)
# Prints requests/s, latency percentiles and non-2xx counts per run, then each server's best
# round and the ratios to `none`. Installs wrk if missing (Debian package).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${LOAD_SECONDS:-10}"
rounds="${ROUNDS:-2}"
connections="${CONNECTIONS:-32}"

if ! command -v wrk >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq wrk >/dev/null
fi
cargo build --release --example load_server --features axum,serde,tokio,metrics
server_bin=target/release/examples/load_server

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

results="$(mktemp)"
trap 'rm -f "$results"; [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null || true' EXIT
for round in $(seq 1 "$rounds"); do
  for server in none tollgate tollgate-no-headers governor; do
    port="$(free_port)"
    TOLLGATE_ADDR="127.0.0.1:$port" "$server_bin" "$server" >/dev/null &
    pid=$!
    for _ in $(seq 1 100); do
      if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
      sleep 0.05
    done
    out="$(wrk -t1 -c"$connections" -d"${seconds}s" --latency -s benches/load/xff.lua "http://127.0.0.1:$port")"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    pid=""
    rps="$(awk '/^Requests\/sec/ {print $2}' <<<"$out")"
    p50="$(awk '$1 == "50%" {print $2}' <<<"$out")"
    p99="$(awk '$1 == "99%" {print $2}' <<<"$out")"
    non2xx="$(awk '/Non-2xx/ {print $NF}' <<<"$out")"
    errors="$(awk '/Socket errors/ {print}' <<<"$out")"
    if [ -z "$rps" ]; then
      echo "load: no result from wrk against $server:" >&2
      echo "$out" >&2
      exit 1
    fi
    printf 'round %s  %-19s %10s req/s  p50 %8s  p99 %8s  non-2xx %s %s\n' \
      "$round" "$server" "$rps" "$p50" "$p99" "${non2xx:-0}" "$errors"
    echo "$server $rps $p99" >>"$results"
  done
done
echo
echo "best round per server (requests/s, its p99), ratio of requests/s to none:"
python3 - "$results" <<'PY'
import sys
best = {}
for line in open(sys.argv[1]):
    server, rps, p99 = line.split()
    if server not in best or float(rps) > best[server][0]:
        best[server] = (float(rps), p99)
base = best["none"][0]
for server in ("none", "tollgate", "tollgate-no-headers", "governor"):
    rps, p99 = best[server]
    print(f"  {server:19} {rps:12.0f} req/s  p99 {p99:>8}  {rps / base:6.3f}x of none")
PY
