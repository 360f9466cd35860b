// --admit: KubeVirt v1.9.0's validating webhook for VirtualMachines
// (VMsAdmitter.Admit in pkg/virt-api/webhooks/validating-webhook/admitters),
// called as a function on an AdmissionReview built from each VM as the
// server holds it. Issue 24 asks that every VM migration 59 wrote passes it;
// without a KubeVirt install the real server runs no webhook, so this is the
// only place the check can happen.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"

	"go.uber.org/mock/gomock"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"

	virtv1 "kubevirt.io/api/core/v1"
	"kubevirt.io/client-go/kubecli"
	"kubevirt.io/client-go/kubevirt/fake"

	instancetypeWebhooks "kubevirt.io/kubevirt/pkg/instancetype/webhooks/vm"
	"kubevirt.io/kubevirt/pkg/testutils"
	"kubevirt.io/kubevirt/pkg/virt-api/webhooks"
	"kubevirt.io/kubevirt/pkg/virt-api/webhooks/validating-webhook/admitters"
	"kubevirt.io/kubevirt/pkg/virt-config/featuregate"
)

type cause struct {
	Type    string `json:"type"`
	Field   string `json:"field"`
	Message string `json:"message"`
}

type admission struct {
	Allowed bool    `json:"allowed"`
	Message string  `json:"message,omitempty"`
	Causes  []cause `json:"causes"`
}

type admitted struct {
	VM        string    `json:"vm"`
	Admission admission `json:"admission"`
}

// The user the review names: anyone but KubeVirt's own service accounts,
// which may set annotations others may not.
const reviewUser = "cozy-migrate"

// gateList collects --feature-gate flags.
type gateList []string

func (g *gateList) String() string { return strings.Join(*g, ",") }

func (g *gateList) Set(name string) error {
	if name == featuregate.HotplugVolumesGate {
		return fmt.Errorf("the oracle's premise is %s off", name)
	}
	*g = append(*g, name)
	return nil
}

// admitAll runs the admitter on every VM of vms (or only those named
// "ns/name"), each as an UPDATE from its old self in olds (or from itself).
func admitAll(vms []virtv1.VirtualMachine, vmis []virtv1.VirtualMachineInstance,
	olds map[string]*virtv1.VirtualMachine, gates, only []string) []admitted {
	admitter := newAdmitter(vmis, gates)
	wanted := map[string]bool{}
	for _, key := range only {
		wanted[key] = false
	}
	out := []admitted{}
	for i := range vms {
		vm := &vms[i]
		key := vm.Namespace + "/" + vm.Name
		if _, named := wanted[key]; len(only) > 0 && !named {
			continue
		}
		wanted[key] = true
		old := olds[key]
		if old == nil {
			old = vm
		}
		out = append(out, admitted{VM: key, Admission: admit(admitter, old, vm)})
	}
	for key, seen := range wanted {
		if !seen {
			fail("--admit: no VirtualMachine " + key)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].VM < out[j].VM })
	return out
}

// newAdmitter builds the VMsAdmitter as virt-api does (NewVMsAdmitter), on
// the cluster config the oracle assumes: DeclarativeHotplugVolumes on,
// HotplugVolumes off, and the other gates asked for. Its client answers only VMI reads (a VM with pending
// status.volumeRequests is checked against its VMI) from a fake seeded with
// the server's VMIs; any other call is an error, not a guess.
func newAdmitter(vmis []virtv1.VirtualMachineInstance, gates []string) *admitters.VMsAdmitter {
	seed := make([]runtime.Object, len(vmis))
	for i := range vmis {
		seed[i] = vmis[i].DeepCopy()
	}
	fakeClient := fake.NewSimpleClientset(seed...)
	mock := kubecli.NewMockKubevirtClient(gomock.NewController(reporter{}))
	mock.EXPECT().VirtualMachineInstance(gomock.Any()).DoAndReturn(func(ns string) kubecli.VirtualMachineInstanceInterface {
		return fakeClient.KubevirtV1().VirtualMachineInstances(ns)
	}).AnyTimes()
	config, _, _ := testutils.NewFakeClusterConfigUsingKVConfig(&virtv1.KubeVirtConfiguration{
		DeveloperConfiguration: &virtv1.DeveloperConfiguration{
			FeatureGates: append([]string{featuregate.DeclarativeHotplugVolumesGate}, gates...),
		},
	})
	if config.HotplugVolumesEnabled() || !config.DeclarativeHotplugVolumesEnabled() {
		fail("--admit: cluster config is not DeclarativeHotplugVolumes on, HotplugVolumes off")
	}
	// DataSourceInformer and NamespaceInformer stay nil: nothing in v1.9.0's
	// admitters package reads them.
	return &admitters.VMsAdmitter{
		VirtClient:              mock,
		InstancetypeAdmitter:    instancetypeWebhooks.NewAdmitter(mock),
		ClusterConfig:           config,
		KubeVirtServiceAccounts: webhooks.KubeVirtServiceAccounts("kubevirt"),
	}
}

// admit sends one UPDATE review, old -> vm, through the admitter.
func admit(admitter *admitters.VMsAdmitter, old, vm *virtv1.VirtualMachine) admission {
	raw, err := json.Marshal(vm)
	if err != nil {
		fail(err.Error())
	}
	oldRaw, err := json.Marshal(old)
	if err != nil {
		fail(err.Error())
	}
	review := &admissionv1.AdmissionReview{Request: &admissionv1.AdmissionRequest{
		Resource:  webhooks.VirtualMachineGroupVersionResource,
		Namespace: vm.Namespace,
		Name:      vm.Name,
		Operation: admissionv1.Update,
		UserInfo:  authenticationv1.UserInfo{Username: reviewUser},
		Object:    runtime.RawExtension{Raw: raw},
		OldObject: runtime.RawExtension{Raw: oldRaw},
	}}
	resp := admitter.Admit(context.Background(), review)
	a := admission{Allowed: resp.Allowed, Causes: []cause{}}
	if resp.Result != nil {
		a.Message = resp.Result.Message
		if resp.Result.Details != nil {
			for _, c := range resp.Result.Details.Causes {
				a.Causes = append(a.Causes, cause{Type: string(c.Type), Field: c.Field, Message: c.Message})
			}
		}
	}
	return a
}

// readOld reads --old FILE: the VMs as they were before a write, as a list
// (`kubectl get vm -A -o json`, or the API's VirtualMachineList).
func readOld(path string) map[string]*virtv1.VirtualMachine {
	olds := map[string]*virtv1.VirtualMachine{}
	if path == "" {
		return olds
	}
	data, err := os.ReadFile(path)
	if err != nil {
		fail(err.Error())
	}
	var list virtv1.VirtualMachineList
	if err := json.Unmarshal(data, &list); err != nil {
		fail(fmt.Sprintf("--old %s: %v", path, err))
	}
	for i := range list.Items {
		vm := &list.Items[i]
		olds[vm.Namespace+"/"+vm.Name] = vm
	}
	return olds
}
