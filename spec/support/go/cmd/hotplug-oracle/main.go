// hotplug-oracle: what KubeVirt v1.9.0's own virt-controller would do to
// every Running VMI's hotplug volumes once the HotplugVolumes gate is off and
// DeclarativeHotplugVolumes is on. Test tooling only (issue 24): migration 59
// exists because of this reconcile, so its specs ask KubeVirt's code, not our
// reading of it.
//
// For each VirtualMachine on the server it pairs the VMI of the same name the
// way the VM controller does (ClaimVirtualMachineInstanceByName: adopts an
// orphan, ignores a VMI another controller owns), then calls
// hotplug.HandleDeclarativeVolumes. Both run against a fake KubeVirt client
// seeded with copies of the VM and VMI, as KubeVirt's own unit tests do, so
// nothing is written to the server. The VMI the fake holds afterwards is
// compared with the one read: what disappeared is a removal, what appeared an
// addition. With --admit it runs KubeVirt's VM admitter instead (admit.go).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"

	"go.uber.org/mock/gomock"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	virtv1 "kubevirt.io/api/core/v1"
	"kubevirt.io/client-go/kubecli"
	"kubevirt.io/client-go/kubevirt"
	"kubevirt.io/client-go/kubevirt/fake"

	"kubevirt.io/kubevirt/pkg/controller"
	"kubevirt.io/kubevirt/pkg/storage/hotplug"
)

// names lists what changed, by name, sorted; always arrays in JSON.
type names struct {
	Volumes []string `json:"volumes"`
	Disks   []string `json:"disks"`
}

type verdict struct {
	VM      string `json:"vm"`
	Removes names  `json:"removes"`
	Adds    names  `json:"adds"`
}

// reporter turns a gomock expectation failure into a fatal error: the mock
// answers only the two calls the hotplug and claim code make.
type reporter struct{}

func (reporter) Errorf(format string, args ...any) { fail(fmt.Sprintf(format, args...)) }
func (reporter) Fatalf(format string, args ...any) { fail(fmt.Sprintf(format, args...)) }

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "hotplug-oracle:", msg)
	os.Exit(2)
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the server to read (required)")
	output := flag.String("output", "json", "output format: json (the only one)")
	admitVMs := flag.Bool("admit", false, "run KubeVirt's VM admitter instead of reconcile")
	oldFile := flag.String("old", "", "with --admit: the VMs before the write, a VirtualMachineList JSON")
	var gates gateList
	flag.Var(&gates, "feature-gate", "with --admit: a feature gate on besides DeclarativeHotplugVolumes (repeatable)")
	flag.Usage = func() {
		fmt.Fprint(os.Stderr, `usage: hotplug-oracle --kubeconfig FILE [--output json]
       hotplug-oracle --kubeconfig FILE --admit [--old FILE] [--feature-gate NAME]... [ns/name ...]

Runs KubeVirt v1.9.0's declarative hotplug reconcile (HandleDeclarativeVolumes,
after the VM controller's VMI claim) for every VirtualMachine on the server,
on a fake client: nothing is written. Prints a JSON array with one entry per VM
whose Running VMI reconcile would change:
  {"vm": "ns/name", "removes": {"volumes": [...], "disks": [...]},
                    "adds":    {"volumes": [...], "disks": [...]}}

With --admit, runs KubeVirt v1.9.0's validating webhook for VMs instead
(VMsAdmitter.Admit, DeclarativeHotplugVolumes on, HotplugVolumes off) on an
UPDATE of every VM (or of those named) from its old self in --old FILE (a
VirtualMachineList, as kubectl get vm -A -o json prints), or from itself.
Each --feature-gate NAME is on too (HotplugVolumes may not be).
Prints one entry per VM:
  {"vm": "ns/name", "admission": {"allowed": bool, "message": "...",
                    "causes": [{"type": ..., "field": ..., "message": ...}]}}
Exit 0 whatever it finds; 2 on a usage, connection or API error, or a named
VM that does not exist.
`)
	}
	flag.Parse()
	if *kubeconfig == "" || *output != "json" || (flag.NArg() != 0 && !*admitVMs) || ((*oldFile != "" || len(gates) > 0) && !*admitVMs) {
		flag.Usage()
		os.Exit(2)
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail(err.Error())
	}
	client, err := kubevirt.NewForConfig(config)
	if err != nil {
		fail(err.Error())
	}
	ctx := context.Background()
	vms, err := client.KubevirtV1().VirtualMachines("").List(ctx, metav1.ListOptions{})
	if err != nil {
		fail("list virtualmachines: " + err.Error())
	}
	vmis, err := client.KubevirtV1().VirtualMachineInstances("").List(ctx, metav1.ListOptions{})
	if err != nil {
		fail("list virtualmachineinstances: " + err.Error())
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if *admitVMs {
		if err := enc.Encode(admitAll(vms.Items, vmis.Items, readOld(*oldFile), gates, flag.Args())); err != nil {
			fail(err.Error())
		}
		return
	}
	byKey := map[string]*virtv1.VirtualMachineInstance{}
	for i := range vmis.Items {
		vmi := &vmis.Items[i]
		byKey[vmi.Namespace+"/"+vmi.Name] = vmi
	}
	verdicts := []verdict{}
	for i := range vms.Items {
		vm := &vms.Items[i]
		vmi := byKey[vm.Namespace+"/"+vm.Name]
		if vmi == nil {
			continue
		}
		if v, changed := reconcile(vm.DeepCopy(), vmi.DeepCopy()); changed {
			verdicts = append(verdicts, v)
		}
	}
	sort.Slice(verdicts, func(i, j int) bool { return verdicts[i].VM < verdicts[j].VM })
	if err := enc.Encode(verdicts); err != nil {
		fail(err.Error())
	}
}

// reconcile runs KubeVirt's claim and declarative hotplug code for one VM
// and its same-named VMI on a fake client seeded with both.
func reconcile(vm *virtv1.VirtualMachine, vmi *virtv1.VirtualMachineInstance) (verdict, bool) {
	ns := vm.Namespace
	v := verdict{VM: ns + "/" + vm.Name, Removes: empty(), Adds: empty()}
	before := vmi.DeepCopy()
	fakeClient := fake.NewSimpleClientset(vm, vmi)
	mock := kubecli.NewMockKubevirtClient(gomock.NewController(reporter{}))
	mock.EXPECT().VirtualMachineInstance(ns).Return(fakeClient.KubevirtV1().VirtualMachineInstances(ns)).AnyTimes()
	mock.EXPECT().VirtualMachine(ns).Return(fakeClient.KubevirtV1().VirtualMachines(ns)).AnyTimes()

	// As the VM controller's execute(): adoption re-checks that the VM is
	// still the one listed (same uid) before taking an orphan VMI.
	canAdopt := controller.RecheckDeletionTimestamp(func() (metav1.Object, error) {
		return fakeClient.KubevirtV1().VirtualMachines(ns).Get(context.Background(), vm.Name, metav1.GetOptions{})
	})
	cm := controller.NewVirtualMachineControllerRefManager(
		controller.RealVirtualMachineControl{Clientset: mock}, vm, nil, virtv1.VirtualMachineGroupVersionKind, canAdopt)
	claimed, err := cm.ClaimVirtualMachineInstanceByName(vmi)
	if err != nil {
		fail(fmt.Sprintf("%s: claim: %v", v.VM, err))
	}
	if claimed == nil {
		return v, false // owned by another controller: the VM controller leaves it alone
	}
	// The claim may have patched the fake's copy (adoption): reconcile what
	// the controller would see next.
	current, err := fakeClient.KubevirtV1().VirtualMachineInstances(ns).Get(context.Background(), vmi.Name, metav1.GetOptions{})
	if err != nil {
		fail(fmt.Sprintf("%s: %v", v.VM, err))
	}
	if err := hotplug.HandleDeclarativeVolumes(mock, vm, current); err != nil {
		fail(fmt.Sprintf("%s: HandleDeclarativeVolumes: %v", v.VM, err))
	}
	after, err := fakeClient.KubevirtV1().VirtualMachineInstances(ns).Get(context.Background(), vmi.Name, metav1.GetOptions{})
	if err != nil {
		fail(fmt.Sprintf("%s: %v", v.VM, err))
	}
	v.Removes.Volumes, v.Adds.Volumes = diff(volumeMap(before.Spec.Volumes), volumeMap(after.Spec.Volumes))
	v.Removes.Disks, v.Adds.Disks = diff(diskMap(before.Spec.Domain.Devices.Disks), diskMap(after.Spec.Domain.Devices.Disks))
	changed := len(v.Removes.Volumes)+len(v.Removes.Disks)+len(v.Adds.Volumes)+len(v.Adds.Disks) > 0
	return v, changed
}

func empty() names { return names{Volumes: []string{}, Disks: []string{}} }

func volumeMap(vols []virtv1.Volume) map[string]any {
	m := map[string]any{}
	for i := range vols {
		m[vols[i].Name] = &vols[i]
	}
	return m
}

func diskMap(disks []virtv1.Disk) map[string]any {
	m := map[string]any{}
	for i := range disks {
		m[disks[i].Name] = &disks[i]
	}
	return m
}

// diff: names gone from after (removed), names new in after (added); a name
// kept with other contents counts as both (reconcile replaced it).
func diff(before, after map[string]any) (removed, added []string) {
	removed, added = []string{}, []string{}
	for name, b := range before {
		a, ok := after[name]
		if !ok || !equality.Semantic.DeepEqual(a, b) {
			removed = append(removed, name)
		}
	}
	for name, a := range after {
		b, ok := before[name]
		if !ok || !equality.Semantic.DeepEqual(a, b) {
			added = append(added, name)
		}
	}
	sort.Strings(removed)
	sort.Strings(added)
	return removed, added
}
