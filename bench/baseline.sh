#!/bin/sh
# Migration 59 done the way the shell migrations did it, as the baseline of
# bench/run (it is not a migration of this repository):
#
#   1. `kubectl get crd virtualmachines.kubevirt.io` (fail closed, absent = no KubeVirt);
#   2. `kubectl get vm,vmi --all-namespaces -o json`, one listing of the fleet;
#   3. one `jq` that joins each Running VMI to its VM (the seed's query) and
#      prints, per VM to change, "NAMESPACE NAME PATCH": a JSON patch that
#      tests the listed metadata.resourceVersion and appends the missing
#      hotplugged volumes, then their disks, in VMI order;
#   4. one `kubectl patch vm --type=json` per such VM;
#   5. `kubectl patch configmap cozystack-version` to stamp 60.
#
# ONLY CORRECT ON THE BENCHMARK FLEET (bench/fleet.lua): it joins VMIs to
# VMs by name only (no uid check, no VMI-named-like-its-VM check), appends to
# lists it assumes exist (no creation of an absent volumes/disks/devices), has
# no bootOrder check, and a conflicting patch (409/422 from the failed test)
# fails the whole script, to be retried from scratch, as the shell loop's Job
# was. migrations/59-vmi-hotplug.lua is the real migration.
#
# It is the lean form of that approach: one jq for the whole fleet, and the
# per-VM loop splits its row with `read` instead of the `jq -r` per field that
# the shell migrations used, so one process per VM is all it forks there.
#
# Environment: KUBECONFIG (the cluster); BENCH_EXEC_LOG, if set, gets one line
# per kubectl or jq started.
set -eu

if [ -n "${BENCH_EXEC_LOG:-}" ]; then
  kubectl() { echo kubectl >>"$BENCH_EXEC_LOG"; command kubectl "$@"; }
  jq() { echo jq >>"$BENCH_EXEC_LOG"; command jq "$@"; }
fi

NAMESPACE=${NAMESPACE:-cozy-system}

stamp() {
  kubectl patch configmap --namespace "$NAMESPACE" cozystack-version \
    --type merge --patch '{"data":{"version":"60"}}' >/dev/null
}

# --ignore-not-found: prints nothing when the CRD is absent, fails on any
# other error (set -e), so only an absent CRD counts as "no KubeVirt".
if [ -z "$(kubectl get crd virtualmachines.kubevirt.io --ignore-not-found --output name)" ]; then
  echo "KubeVirt is not installed, nothing to copy"
  stamp
  exit 0
fi

tmp=$(mktemp -d -t m59-baseline.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

kubectl get vm,vmi --all-namespaces --output json >"$tmp/fleet.json"

jq --raw-output '
  ([.items[] | select(.kind == "VirtualMachine")
    | {key: "\(.metadata.namespace)/\(.metadata.name)", value: .}] | from_entries) as $vm
  | .items[]
  | select(.kind == "VirtualMachineInstance" and .status.phase == "Running")
  | ([.metadata.ownerReferences[]?
      | select(.controller == true and .kind == "VirtualMachine" and (.apiVersion | startswith("kubevirt.io/")))
      | .name][0]) as $owner
  | select($owner != null)
  | $vm["\(.metadata.namespace)/\($owner)"] as $v
  | select($v != null)
  | [$v.spec.template.spec.volumes[]?.name] as $have_volumes
  | [$v.spec.template.spec.domain.devices.disks[]?.name] as $have_disks
  | [.spec.volumes[]?
      | select(.dataVolume.hotpluggable == true or .persistentVolumeClaim.hotpluggable == true)
      | select(.name as $n | $have_volumes | index($n) | not)] as $volumes
  | select($volumes | length > 0)
  | [$volumes[].name] as $names
  | [.spec.domain.devices.disks[]?
      | select(.name as $n | ($names | index($n)) and ($have_disks | index($n) | not))] as $disks
  | ([{op: "test", path: "/metadata/resourceVersion", value: $v.metadata.resourceVersion}]
     + [$volumes[] | {op: "add", path: "/spec/template/spec/volumes/-", value: .}]
     + [$disks[] | {op: "add", path: "/spec/template/spec/domain/devices/disks/-", value: .}]) as $patch
  | "\($v.metadata.namespace) \($v.metadata.name) \($patch | tojson)"
' "$tmp/fleet.json" >"$tmp/plan"

updated=0
while read -r ns name patch; do
  kubectl patch vm --namespace "$ns" "$name" --type json --patch "$patch" >/dev/null
  echo "VM $ns/$name: adding hotplugged volumes to the VM spec"
  updated=$((updated + 1))
done <"$tmp/plan"

echo "updated $updated VMs"
stamp
