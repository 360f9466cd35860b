#!/bin/sh
# Migration 59 by cozy-migrate against the same job done the shell scripts'
# way (bench/m59/baseline.sh: kubectl + jq), on the same generated fleet and
# the same fake API server setup (spec/support/fake-apiserver: TLS, token,
# --latency-ms per API request), in one invocation. See bench/README.md,
# "Migration 59 vs the shell approach".
#
#   bench/m59/run.sh [VMS=1000] [REPETITIONS=3]
#
# Environment:
#   COZY_MIGRATE_BIN        the binary (else build/cozy-migrate)
#   M59_LATENCY_MS          the fake's --latency-ms (default 2)
#   M59_NAMESPACES          namespaces the VMs are spread over (default 10)
#   M59_RUN_TIMEOUT         seconds one variant run may take (default 900)
#   M59_BASELINE            the baseline script (default bench/m59/baseline.sh;
#                           a deliberately wrong one shows the comparison fail)
#   FAKE_APISERVER_PYTHON   the fake's interpreter (default /usr/bin/python3)
#
# Every repetition runs each variant against a fresh server loaded with the
# same fixture: the shell baseline, cozy-migrate as deployed (default client
# rate limit, 20 requests/s after a burst of 40), and cozy-migrate with the
# limiter opened (--qps 1000 --burst 1000), interleaved so that the machine's
# load drifts over all of them alike. Measured per run: wall time of the
# command alone (not the server's start), CPU time of its process tree, the
# requests in the fake's log by method and by kind, and the processes started.
# After each run the VM specs in /_fake/objects must equal those after the
# first baseline run, and must differ from the fixture in exactly the VMs
# that need the copy; otherwise the script fails.
#
# Listens on 127.0.0.1 only; every server and temp file is removed on exit.
set -eu

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
bin=${COZY_MIGRATE_BIN:-$root/build/cozy-migrate}
python=${FAKE_APISERVER_PYTHON:-/usr/bin/python3}
vms=${1:-1000}
reps=${2:-3}
latency=${M59_LATENCY_MS:-2}
namespaces=${M59_NAMESPACES:-10}
run_timeout=${M59_RUN_TIMEOUT:-900}
baseline=${M59_BASELINE:-bench/m59/baseline.sh}

die() { echo "bench/m59: $*" >&2; exit 2; }
for n in "$vms" "$reps" "$latency" "$namespaces" "$run_timeout"; do
  case $n in ''|*[!0-9]*) die "not a non-negative integer: '$n' (usage: run.sh [VMS] [REPETITIONS])" ;; esac
done
if [ "$vms" -eq 0 ] || [ "$reps" -eq 0 ] || [ "$namespaces" -eq 0 ]; then
  die "VMS, REPETITIONS and M59_NAMESPACES must be positive"
fi
[ -x "$bin" ] || die "$bin is not built (cmake -S . -B build && cmake --build build), or set COZY_MIGRATE_BIN"
for tool in kubectl jq curl awk timeout; do
  command -v "$tool" >/dev/null || die "needs $tool on PATH"
done
[ -x "$python" ] || die "no $python (set FAKE_APISERVER_PYTHON)"
[ -x /usr/bin/time ] || die "needs /usr/bin/time (Debian package time)"
[ -f "$baseline" ] || die "no baseline script $baseline"

dir=$(mktemp -d -t cozy-m59-bench.XXXXXX)
server_pid=
stop_server() {
  [ -n "$server_pid" ] || return 0
  kill "$server_pid" 2>/dev/null || true
  i=0
  while kill -0 "$server_pid" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
  kill -9 "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=
}
cleanup() {
  stop_server
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A fresh fake API server with the fleet; sets $url, $run (its own temp dir).
start_server() {
  run=$(mktemp -d "$dir/run.XXXXXX")
  "$python" "$root/spec/support/fake-apiserver" --fixture "$dir/fleet.json" --listen 127.0.0.1:0 --tls --token bench \
    --latency-ms "$latency" --kubeconfig-out "$run/kubeconfig" --ca-out "$run/ca.pem" \
    --ready-file "$run/ready" >"$run/server.log" 2>&1 &
  server_pid=$!
  i=0
  until [ -s "$run/ready" ]; do
    i=$((i + 1))
    if [ $i -gt 600 ] || ! kill -0 "$server_pid" 2>/dev/null; then
      cat "$run/server.log" >&2
      die "the fake API server did not start"
    fi
    sleep 0.1
  done
  url=$(cat "$run/ready")
  case $url in https://127.0.0.1:*) ;; *) die "unexpected server address $url" ;; esac
}

control() { curl -sS --fail --max-time 120 --cacert "$run/ca.pem" "$url$1"; }

now_ns() { date +%s%N; }

# Canonical VM specs: one line per VM, "namespace/name <spec with sorted keys>".
vm_specs() {
  jq -S -c -r '.items[] | select(.kind == "VirtualMachine")
    | "\(.metadata.namespace)/\(.metadata.name) \(.spec | tojson)"' | sort
}
# The same, reduced to what a reader checks first: template volume and disk names.
vm_names() {
  jq -r '.items[] | select(.kind == "VirtualMachine")
    | "\(.metadata.namespace)/\(.metadata.name) volumes=\([.spec.template.spec.volumes[]?.name] | join(","))"
      + " disks=\([.spec.template.spec.domain.devices.disks[]?.name] | join(","))"' | sort
}

# Request log -> one line of counts:
# total GET PATCH POST PUT DELETE discovery crd list vm_get vm_patch stamp lock version_read other
# errors (dropped, or 4xx/5xx other than 404: the lock's first GET answers 404)
# shellcheck disable=SC2016 # a jq program: its $ are jq's
REQUEST_COUNTS='
  def kind:
    if (.path | test("/leases(/|$)")) then "lock"
    elif (.path | test("/configmaps/cozystack-version$")) then (if .method == "GET" then "version_read" else "stamp" end)
    elif (.path | test("/customresourcedefinitions(/|$)")) then "crd"
    elif (.path | test("^/apis/kubevirt\\.io/v1/(namespaces/[^/]+/)?(virtualmachines|virtualmachineinstances)$")) then "list"
    elif (.path | test("^/apis/kubevirt\\.io/v1/namespaces/[^/]+/virtualmachines/[^/]+$"))
      then (if .method == "PATCH" then "vm_patch" else "vm_get" end)
    elif (.path | test("^/(version|openapi)(/|$)|^/api(/[^/]+)?$|^/apis(/[^/]+){0,2}$")) then "discovery"
    else "other" end;
  def n(f): map(select(f)) | length;
  [length, n(.method == "GET"), n(.method == "PATCH"), n(.method == "POST"), n(.method == "PUT"),
   n(.method == "DELETE")]
  + (map(kind) as $k | ["discovery", "crd", "list", "vm_get", "vm_patch", "stamp", "lock", "version_read", "other"]
     | map(. as $c | $k | map(select(. == $c)) | length))
  + [n(.status == 0 or (.status >= 400 and .status != 404))]
  | map(tostring) | join(" ")'

# One run of a variant: fresh server, the command timed, then its requests
# and final objects checked. Appends a line to $dir/results.
#   run_variant NAME REP COMMAND...
run_variant() {
  name=$1 rep=$2
  shift 2
  start_server
  : >"$run/exec.log"
  t0=$(now_ns)
  if ! KUBECONFIG="$run/kubeconfig" KUBECACHEDIR="$run/kube-cache" BENCH_EXEC_LOG="$run/exec.log" \
      /usr/bin/time -f '%U %S' -o "$run/cpu" timeout -k 10 "$run_timeout" "$@" >"$run/stdout" 2>"$run/stderr"; then
    tail -n 20 "$run/stderr" >&2
    die "$name (repetition $rep) failed"
  fi
  t1=$(now_ns)
  control /_fake/requests >"$run/requests.json"
  control /_fake/objects >"$run/objects.json"
  stop_server
  counts=$(jq -r "$REQUEST_COUNTS" "$run/requests.json")
  if [ "$name" = baseline ]; then
    processes=$(grep -c . "$run/exec.log" || true)
  else
    processes=1
  fi
  jq -e -r '.items[] | select(.kind == "ConfigMap" and .metadata.name == "cozystack-version") | .data.version' \
    "$run/objects.json" | grep -qx 60 || die "$name (repetition $rep) did not stamp 60"
  vm_specs <"$run/objects.json" >"$run/specs"
  if [ ! -f "$dir/reference.specs" ]; then
    cp "$run/specs" "$dir/reference.specs"
    vm_names <"$run/objects.json" >"$dir/reference.names"
    changed=$(comm -13 "$dir/fixture.specs" "$dir/reference.specs" | grep -c . || true)
    [ "$changed" -eq "$need" ] || die "$name changed $changed VMs, the fleet has $need that need the copy"
  elif ! cmp -s "$run/specs" "$dir/reference.specs"; then
    vm_names <"$run/objects.json" >"$run/names"
    echo "FAIL: the final VM specs after $name (repetition $rep) differ from those after the baseline:" >&2
    diff "$dir/reference.names" "$run/names" | grep '^[<>]' | head -n 20 >&2 ||
      diff "$dir/reference.specs" "$run/specs" | grep '^[<>]' | cut -d' ' -f1-2 | head -n 20 >&2 || true
    echo "(< after the baseline, > after $name)" >&2
    exit 1
  fi
  cpu=$(awk '{ printf "%.2f", $1 + $2 }' "$run/cpu" 2>/dev/null || echo "-")
  echo "$name $rep $(((t1 - t0) / 1000)) $cpu $processes $counts" >>"$dir/results"
  printf '  %-14s rep %d: %6.2f s wall, %s s CPU, %s requests\n' "$name" "$rep" \
    "$(awk "BEGIN { print ($t1 - $t0) / 1e9 }")" "$cpu" "${counts%% *}"
  rm -rf "$run"
}

echo "generating the fleet: $vms VMs over $namespaces namespaces"
summary=$("$bin" lua bench/m59/fleet.lua "$dir/fleet.json" "$vms" "$namespaces")
echo "  $summary"
need=$(echo "$summary" | sed -n 's/.* \([0-9][0-9]*\) VMs need the copy.*/\1/p')
[ -n "$need" ] || die "cannot read the fleet summary"
vm_specs <"$dir/fleet.json" >"$dir/fixture.specs"

load_start=$(cut -d' ' -f1-3 /proc/loadavg)
echo "fake API server: TLS, token, --latency-ms $latency"
echo "machine: nproc $(nproc), load average $load_start; $reps repetitions"
r=1
while [ $r -le "$reps" ]; do
  run_variant baseline $r sh "$baseline"
  run_variant cozy-migrate $r "$bin" run
  run_variant cozy-fast $r "$bin" run --qps 1000 --burst 1000
  r=$((r + 1))
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

# The table: median of every column over the repetitions, min/max of the wall time.
awk -v load_start="$load_start" -v load_end="$load_end" '
  function median(name, col,   n, i, j, t, v) {
    n = 0
    for (i = 1; i <= rows; i++) if (row_name[i] == name) v[++n] = cell[i, col]
    for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
    lo[name, col] = v[1]; hi[name, col] = v[n]
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  { rows++; row_name[rows] = $1; for (c = 3; c <= NF; c++) cell[rows, c] = $c }
  END {
    split("baseline cozy-migrate cozy-fast", names, " ")
    label["baseline"] = "shell baseline (kubectl + jq)"
    label["cozy-migrate"] = "cozy-migrate run (defaults)"
    label["cozy-fast"] = "cozy-migrate run --qps 1000 --burst 1000"
    # columns: 3 wall_us 4 cpu 5 processes 6 total 7 GET 8 PATCH 9 POST 10 PUT 11 DELETE
    # 12 discovery 13 crd 14 list 15 vm_get 16 vm_patch 17 stamp 18 lock 19 version_read 20 other 21 errors
    printf "\n%-42s %8s %7s %7s %6s %9s %5s %6s %5s %4s %7s\n", "", "wall s", "min", "max", "CPU s",
      "processes", "reqs", "GET", "PATCH", "POST", "PUT+DEL"
    for (k = 1; k <= 3; k++) {
      n = names[k]
      wall[n] = median(n, 3) / 1e6; total[n] = median(n, 6)
      bookkeeping[n] = median(n, 18) + median(n, 19)
      printf "%-42s %8.2f %7.2f %7.2f %6.2f %9d %5d %6d %5d %4d %7d\n", label[n], wall[n], lo[n, 3] / 1e6, hi[n, 3] / 1e6,
        median(n, 4), median(n, 5), total[n], median(n, 7), median(n, 8), median(n, 9), median(n, 10) + median(n, 11)
    }
    printf "\nrequests by kind (median)                    %9s %4s %4s %6s %8s %5s %4s %12s %5s %6s\n",
      "discovery", "CRD", "list", "VM GET", "VM PATCH", "stamp", "lock", "version read", "other", "errors"
    for (k = 1; k <= 3; k++) {
      n = names[k]
      printf "%-44s %9d %4d %4d %6d %8d %5d %4d %12d %5d %6d\n", label[n], median(n, 12), median(n, 13), median(n, 14),
        median(n, 15), median(n, 16), median(n, 17), median(n, 18), median(n, 19), median(n, 20), median(n, 21)
    }
    printf "\nload average: %s at the start, %s at the end\n", load_start, load_end
    for (k = 2; k <= 3; k++) {
      n = names[k]
      printf "ratio baseline/%s: time %.2f (median), requests %.2f (%.2f without its %d lock and version-read requests)\n",
        label[n], wall["baseline"] / wall[n], total["baseline"] / total[n],
        total["baseline"] / (total[n] - bookkeeping[n]), bookkeeping[n]
    }
  }' "$dir/results"
echo "final VM specs: identical after every run ($need VMs changed, the stamp at 60)"
