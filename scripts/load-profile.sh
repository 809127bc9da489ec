#!/usr/bin/env bash
# The load test's servers counted instead of timed: each server of examples/load_server.rs
# runs under valgrind's callgrind while wrk sends it the load test's requests
# (benches/load/xff.lua: 10,000 client IPs in X-Forwarded-For from the trusted 127.0.0.1), and
# the instructions the server executes are divided by the requests wrk counted. Kernel work
# (the sockets) is not counted; everything in the process is (hyper, axum, the layer, malloc).
# Instruction counts do not move with the VM's load: they resolve differences of a few percent
# that the wrk throughput (10-15 % apart between rounds here) cannot.
#   bash scripts/load-profile.sh                      none, tollgate, tollgate-no-headers, governor
#   bash scripts/load-profile.sh tollgate governor    some of them
# Warm-up (every client seen a few times: WARM seconds, default 20) and measured window
# (SECONDS_MEASURED, default 8) are wall time under valgrind (~2k requests/s). The callgrind
# files stay in target/load-profile/ for callgrind_annotate. Installs valgrind and wrk if
# missing (Debian packages).
set -euo pipefail
cd "$(dirname "$0")/.."
warm="${WARM:-20}"
measured="${SECONDS_MEASURED:-8}"
servers=("$@")
[ ${#servers[@]} -gt 0 ] || servers=(none tollgate tollgate-no-headers governor)

missing=()
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v valgrind >/dev/null 2>&1 || missing+=(valgrind)
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
cargo build --release --example load_server --features axum,serde,tokio,metrics
target_dir="${CARGO_TARGET_DIR:-target}"
server_bin="$target_dir/release/examples/load_server"
out_dir="$target_dir/load-profile"
mkdir -p "$out_dir"

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

trap '[ -n "${pid:-}" ] && kill "$pid" 2>/dev/null || true' EXIT
for server in "${servers[@]}"; do
  port="$(free_port)"
  rm -f "$out_dir/$server".out*
  TOLLGATE_ADDR="127.0.0.1:$port" valgrind --tool=callgrind \
    --callgrind-out-file="$out_dir/$server.out" "$server_bin" "$server" >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 1 200); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
    sleep 0.1
  done
  wrk -t1 -c4 -d"${warm}s" -s benches/load/xff.lua "http://127.0.0.1:$port" >/dev/null
  callgrind_control -z "$pid" >/dev/null 2>&1
  result="$(wrk -t1 -c4 -d"${measured}s" -s benches/load/xff.lua "http://127.0.0.1:$port")"
  callgrind_control -d "$pid" >/dev/null 2>&1
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=""
  requests="$(awk '/requests in/ {print $1}' <<<"$result")"
  if [ -z "$requests" ] || [ "$requests" = 0 ]; then
    echo "load-profile: no requests counted against $server:" >&2
    echo "$result" >&2
    exit 1
  fi
  dump="$(ls -t "$out_dir/$server".out.* | head -1)"
  instructions="$(awk '/^(summary|totals):/ {print $2; exit}' "$dump")"
  printf '%-19s %8s requests  %7d instructions/request  (%s)\n' "$server" "$requests" \
    "$((instructions / requests))" "$dump"
done
