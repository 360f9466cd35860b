// Command clientgo is bench/run's client-go peer: migration 59's rule
// (migrations/59-vmi-hotplug.lua) written the way a Kubernetes engineer
// would write it in Go, to measure the engine against. Benchmark tooling
// only: never linked into cozy-migrate.
//
//   - the dynamic (unstructured) client: KubeVirt's CRDs speak JSON only;
//   - the VM and VMI lists read at once, each with client-go's list pager at
//     the engine's page size, the next page fetched while one is processed;
//   - each page reduced at once to what the rule reads (names, uids,
//     resourceVersion, hotplug volumes and their disks), so memory follows
//     the fleet's count, not its bytes;
//   - one JSON patch per VM, its first op a `test` of the listed
//     resourceVersion; on a failed test (422) or a 409 the VM is re-read and
//     the rule applied again (retry.RetryOnConflict);
//   - a worker pool of the engine's concurrency, the rest.Config's QPS and
//     burst at the engine's defaults;
//   - the version ConfigMap stamped last, as the baseline does.
//
// Usage: clientgo [--kubeconfig FILE] [--page-size 500] [--concurrency 8]
//
//	[--qps 1000] [--burst 2000] [--cpuprofile FILE] [--memprofile FILE]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/pager"
	"k8s.io/client-go/util/retry"
)

var (
	vmGVR  = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachines"}
	vmiGVR = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}
	cmGVR  = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
)

// vm is what the rule reads of a VirtualMachine.
type vm struct {
	namespace, name, uid, resourceVersion string
	strategy                              string
	hasVolumes, hasDisks                  bool // the lists exist (an add to "/-" needs them)
	volumes, disks                        map[string]bool
}

// vmi is what the rule reads of a VirtualMachineInstance: its controller
// reference and its hotplug volumes with their disks, kept verbatim.
type vmi struct {
	namespace, name, phase string
	ownerName, ownerUID    string
	hotplug                []map[string]any // in VMI order
	disks                  []map[string]any // all the VMI's disks, in order
}

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig (default $KUBECONFIG)")
	pageSize := flag.Int64("page-size", 500, "list page size (the engine's page_limit)")
	concurrency := flag.Int("concurrency", 8, "writes in flight (the engine's --concurrency default)")
	qps := flag.Float64("qps", 1000, "client-side rate limit (the engine's --qps default)")
	burst := flag.Int("burst", 2000, "bursts above --qps (the engine's --burst default)")
	namespace := flag.String("namespace", "cozy-system", "namespace of the cozystack-version ConfigMap")
	cpuprofile := flag.String("cpuprofile", "", "write a pprof CPU profile to FILE")
	memprofile := flag.String("memprofile", "", "write a pprof heap profile to FILE at the end")
	flag.Parse()

	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		check(err)
		check(pprof.StartCPUProfile(f))
		defer pprof.StopCPUProfile()
	}
	err := run(context.Background(), *kubeconfig, *pageSize, *concurrency, float32(*qps), *burst, *namespace)
	if *memprofile != "" {
		f, ferr := os.Create(*memprofile)
		check(ferr)
		check(pprof.WriteHeapProfile(f))
		check(f.Close())
	}
	if err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "clientgo:", err)
		os.Exit(1)
	}
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "clientgo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, kubeconfig string, pageSize int64, concurrency int, qps float32, burst int, namespace string) error {
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	config.QPS, config.Burst = qps, burst
	config.UserAgent = "bench-clientgo"
	client, err := dynamic.NewForConfig(config)
	if err != nil {
		return err
	}

	// KubeVirt served at all? One discovery request, as the engine's `served`.
	served, err := kubevirtServed(config)
	if err != nil {
		return err
	}
	if served {
		if err := copyVolumes(ctx, client, pageSize, concurrency); err != nil {
			return err
		}
	} else {
		fmt.Println("KubeVirt is not installed, nothing to copy")
	}
	stamp := []byte(`{"data":{"version":"60"}}`)
	_, err = client.Resource(cmGVR).Namespace(namespace).Patch(ctx, "cozystack-version", types.MergePatchType, stamp, metav1.PatchOptions{})
	return err
}

func kubevirtServed(config *rest.Config) (bool, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(config)
	if err != nil {
		return false, err
	}
	list, err := dc.ServerResourcesForGroupVersion(vmGVR.GroupVersion().String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	have := map[string]bool{}
	for _, r := range list.APIResources {
		have[r.Name] = true
	}
	return have["virtualmachines"] && have["virtualmachineinstances"], nil
}

// listEach reads a resource across namespaces with client-go's pager,
// handing each item to fn; PageBufferSize lets the pager fetch the next page
// while fn works through this one.
func listEach(ctx context.Context, client dynamic.Interface, gvr schema.GroupVersionResource, pageSize int64, fn func(*unstructured.Unstructured) error) error {
	p := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return client.Resource(gvr).List(ctx, opts)
	})
	p.PageSize = pageSize
	p.PageBufferSize = 2
	return p.EachListItem(ctx, metav1.ListOptions{}, func(o runtime.Object) error {
		return fn(o.(*unstructured.Unstructured))
	})
}

func copyVolumes(ctx context.Context, client dynamic.Interface, pageSize int64, concurrency int) error {
	vms := map[string]*vm{}
	vmis := []*vmi{}
	var wg sync.WaitGroup
	var vmErr, vmiErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		vmErr = listEach(ctx, client, vmGVR, pageSize, func(u *unstructured.Unstructured) error {
			v := reduceVM(u)
			vms[v.namespace+"/"+v.name] = v
			return nil
		})
	}()
	go func() {
		defer wg.Done()
		vmiErr = listEach(ctx, client, vmiGVR, pageSize, func(u *unstructured.Unstructured) error {
			if i := reduceVMI(u); i != nil {
				vmis = append(vmis, i)
			}
			return nil
		})
	}()
	wg.Wait()
	if err := errors.Join(vmErr, vmiErr); err != nil {
		return err
	}

	type job struct {
		vm  *vm
		vmi *vmi
	}
	jobs := make(chan job)
	var updated, volumes atomic.Int64
	var firstErr error
	var errOnce sync.Once
	var workers sync.WaitGroup
	for w := 0; w < concurrency; w++ {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for j := range jobs {
				n, err := copyInto(ctx, client, j.vm, j.vmi)
				if err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("VM %s/%s: %w", j.vm.namespace, j.vm.name, err) })
					continue
				}
				if n > 0 {
					updated.Add(1)
					volumes.Add(int64(n))
				}
			}
		}()
	}
	for _, i := range vmis {
		v := vms[i.namespace+"/"+i.ownerName]
		if v == nil || (i.ownerUID != "" && i.ownerUID != v.uid) || i.name != i.ownerName || i.phase != "Running" || v.strategy == "Migration" {
			continue
		}
		if len(missing(v, i)) > 0 {
			jobs <- job{v, i}
		}
	}
	close(jobs)
	workers.Wait()
	if firstErr != nil {
		return firstErr
	}
	fmt.Printf("updated %d VMs: %d volumes copied; %d VMs, %d VMIs with hotplug volumes\n", updated.Load(), volumes.Load(), len(vms), len(vmis))
	return nil
}

func reduceVM(u *unstructured.Unstructured) *vm {
	v := &vm{namespace: u.GetNamespace(), name: u.GetName(), uid: string(u.GetUID()), resourceVersion: u.GetResourceVersion(),
		volumes: map[string]bool{}, disks: map[string]bool{}}
	v.strategy, _, _ = unstructured.NestedString(u.Object, "spec", "updateVolumesStrategy")
	vols, hasVols, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "volumes")
	disks, hasDisks, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "domain", "devices", "disks")
	v.hasVolumes, v.hasDisks = hasVols, hasDisks
	for _, x := range vols {
		if m, ok := x.(map[string]any); ok {
			v.volumes[fmt.Sprint(m["name"])] = true
		}
	}
	for _, x := range disks {
		if m, ok := x.(map[string]any); ok {
			v.disks[fmt.Sprint(m["name"])] = true
		}
	}
	return v
}

func isHotplug(volume map[string]any) bool {
	for _, source := range []string{"dataVolume", "persistentVolumeClaim"} {
		if h, ok, _ := unstructured.NestedBool(volume, source, "hotpluggable"); ok && h {
			return true
		}
	}
	return false
}

// reduceVMI keeps a VMI with hotplug volumes and a VirtualMachine controller
// (or none: its VM's by name, as virt-controller adopts it); nil otherwise.
func reduceVMI(u *unstructured.Unstructured) *vmi {
	vols, _, _ := unstructured.NestedSlice(u.Object, "spec", "volumes")
	i := &vmi{namespace: u.GetNamespace(), name: u.GetName()}
	for _, x := range vols {
		if m, ok := x.(map[string]any); ok && isHotplug(m) {
			i.hotplug = append(i.hotplug, m)
		}
	}
	if len(i.hotplug) == 0 {
		return nil
	}
	ref := metav1.GetControllerOf(u)
	switch {
	case ref == nil:
		i.ownerName = i.name
	case ref.Kind == "VirtualMachine" && strings.HasPrefix(ref.APIVersion, "kubevirt.io/"):
		i.ownerName, i.ownerUID = ref.Name, string(ref.UID)
	default:
		return nil
	}
	i.phase, _, _ = unstructured.NestedString(u.Object, "status", "phase")
	disks, _, _ := unstructured.NestedSlice(u.Object, "spec", "domain", "devices", "disks")
	for _, x := range disks {
		if m, ok := x.(map[string]any); ok {
			i.disks = append(i.disks, m)
		}
	}
	return i
}

// missing is the VMI's hotplug volumes the VM's template lacks, in VMI order.
func missing(v *vm, i *vmi) []map[string]any {
	var out []map[string]any
	for _, volume := range i.hotplug {
		if !v.volumes[fmt.Sprint(volume["name"])] {
			out = append(out, volume)
		}
	}
	return out
}

type op struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// patchFor is the JSON patch that copies what the VMI alone holds into v.
func patchFor(v *vm, i *vmi) ([]byte, int) {
	volumes := missing(v, i)
	if len(volumes) == 0 {
		return nil, 0
	}
	names := map[string]bool{}
	for _, volume := range volumes {
		names[fmt.Sprint(volume["name"])] = true
	}
	var disks []any
	for _, d := range i.disks {
		n := fmt.Sprint(d["name"])
		if names[n] && !v.disks[n] {
			disks = append(disks, d)
		}
	}
	ops := []op{{"test", "/metadata/resourceVersion", v.resourceVersion}}
	ops = appendOps(ops, "/spec/template/spec/volumes", v.hasVolumes, toAny(volumes))
	if len(disks) > 0 {
		ops = appendOps(ops, "/spec/template/spec/domain/devices/disks", v.hasDisks, disks)
	}
	body, err := json.Marshal(ops)
	check(err)
	return body, len(volumes)
}

func toAny(ms []map[string]any) []any {
	out := make([]any, len(ms))
	for k, m := range ms {
		out[k] = m
	}
	return out
}

// appendOps adds to the end of the list at path, or creates it.
func appendOps(ops []op, path string, exists bool, values []any) []op {
	if !exists {
		return append(ops, op{"add", path, values})
	}
	for _, value := range values {
		ops = append(ops, op{"add", path + "/-", value})
	}
	return ops
}

// copyInto patches v from its listed state; after a lost race (409, or the
// 422 of a failed `test`, which only a re-read tells from a bad patch) it
// re-reads the VM and applies the rule again. Returns the volumes copied.
func copyInto(ctx context.Context, client dynamic.Interface, v *vm, i *vmi) (int, error) {
	vms := client.Resource(vmGVR).Namespace(v.namespace)
	current := v
	copied := 0
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		body, n := patchFor(current, i)
		if body == nil {
			copied = 0
			return nil
		}
		_, err := vms.Patch(ctx, current.name, types.JSONPatchType, body, metav1.PatchOptions{})
		if err == nil {
			copied = n
			return nil
		}
		if !apierrors.IsConflict(err) && !apierrors.IsInvalid(err) {
			return err
		}
		fresh, gerr := vms.Get(ctx, current.name, metav1.GetOptions{})
		if apierrors.IsNotFound(gerr) {
			copied = 0
			return nil // deleted meanwhile: nothing to copy
		}
		if gerr != nil {
			return gerr
		}
		if fresh.GetResourceVersion() == current.resourceVersion {
			return err // not a race: the patch itself is refused
		}
		if string(fresh.GetUID()) != v.uid {
			copied = 0
			return nil // another VM of that name now
		}
		current = reduceVM(fresh)
		return apierrors.NewConflict(vmGVR.GroupResource(), current.name, err)
	})
	return copied, err
}
