#!/bin/sh
# The whole product in under a minute, against a simulated cluster: starts the
# fake API server with hack/demo/fleet.json (three tenants, 20 KubeVirt VMs
# before the upgrade that drops the HotplugVolumes gate), then runs
# cozy-migrate status, check, plan, run (twice) and status against it, and
# shows what migration 59 changed in one VM. Installs and builds nothing: run
# it after the README's set-up command.
#
#   hack/demo.sh                          # uses $COZY_MIGRATE_BIN, else build/cozy-migrate
#   COZY_DEMO_SERVER=real hack/demo.sh    # the same against a real control plane
#
# COZY_DEMO_SERVER picks the cluster: "fake" (the default) is the fake API
# server (spec/support/fake-apiserver, Python); "real" is a real
# kube-apiserver with etcd, RBAC and KubeVirt's own CRDs
# (spec/support/kube-apiserver, as the specs' real/ tests use it; it needs Go,
# builds itself on first use and takes a few seconds more to start).
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${COZY_MIGRATE_BIN:-$root/build/cozy-migrate}
python=${FAKE_APISERVER_PYTHON:-/usr/bin/python3}
server=${COZY_DEMO_SERVER:-fake}
case $server in
  fake|real) ;;
  *) echo "demo: COZY_DEMO_SERVER must be fake or real, not $server" >&2; exit 2 ;;
esac

[ -x "$bin" ] || { echo "demo: $bin is not built (cmake -S . -B build && cmake --build build)" >&2; exit 2; }
for tool in kubectl jq; do
  command -v "$tool" >/dev/null || { echo "demo: needs $tool on PATH" >&2; exit 2; }
done

dir=$(mktemp -d -t cozy-migrate-demo.XXXXXX)
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
# Runs cozy-migrate with its command line shown.
show() { printf '$ cozy-migrate %s\n' "$*"; "$bin" "$@"; }
# The same with the log (stderr) shown only if the command fails: for
# commands whose stdout already says everything.
quiet() {
  printf '$ cozy-migrate %s\n' "$*"
  "$bin" "$@" 2>"$dir/stderr" || { cat "$dir/stderr" >&2; return 1; }
}

if [ "$server" = real ]; then
  step "Starting a cluster (real kube-apiserver and etcd, TLS, token) with hack/demo/fleet.json"
  # exec'd by its wrapper scripts: $! is the server itself, which TERM stops
  "$root/spec/support/kube-apiserver" --fixture "$root/hack/demo/fleet.json" --token demo \
    --kubeconfig-out "$dir/kubeconfig" --ready-file "$dir/ready" >"$dir/server.log" 2>&1 &
  # a first start builds the control plane (minutes); later ones take seconds
  ticks=6000
else
  step "Starting a simulated cluster (fake API server, TLS, token) with hack/demo/fleet.json"
  "$python" "$root/spec/support/fake-apiserver" --fixture "$root/hack/demo/fleet.json" --tls --token demo \
    --kubeconfig-out "$dir/kubeconfig" --ready-file "$dir/ready" >"$dir/server.log" 2>&1 &
  ticks=100
fi
server_pid=$!
i=0
until [ -s "$dir/ready" ]; do
  i=$((i + 1))
  if [ $i -gt $ticks ] || ! kill -0 "$server_pid" 2>/dev/null; then
    echo "demo: the $server API server did not start:" >&2
    cat "$dir/server.log" >&2
    exit 1
  fi
  sleep 0.1
done
# cozy-migrate, like kubectl, finds the cluster through $KUBECONFIG.
export KUBECONFIG="$dir/kubeconfig"
kubectl get vm,vmi --all-namespaces

vm_ns=tenant-alpha
vm=kubernetes-prod-md0-5x8kq-2tb7z
volumes() {
  kubectl get vm -n $vm_ns $vm -o json | jq -r '.spec.template.spec.volumes[].name' | sed 's/^/  /'
}

step "status: the cluster is at version 59, migration 59-vmi-hotplug is pending"
show status

step "check: read-only preflight; 59 lists each VMI-only volume it would copy, and warns"
quiet check

step "plan: the patches run would send, nothing written"
quiet plan

step "Before: the volumes VM $vm_ns/$vm lists (its VMI also holds two kubevirt-csi volumes)"
volumes

step "run: copy the volumes, stamp 60"
show run

step "After: the same VM lists its VMI's hotplugged volumes too"
volumes

step "run again (after putting the stamp back to 59): nothing to update, no write"
kubectl patch configmap -n cozy-system cozystack-version --type merge -p '{"data":{"version":"59"}}' >/dev/null
show run

step "status: version 60, nothing pending, and the history of both runs"
show status
