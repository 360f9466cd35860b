// Resets: back to the fixtures, removing what specs made and keeping what
// nothing changed.

package main

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
)

// resetTo replaces the state by the fixtures in texts. When they are the
// fixtures loaded last (the usual reset: before each test of a block), a
// fixture object nothing changed since it was loaded is kept as it is; one
// that was changed or deleted is made again (as is what it owns, and what
// its namespace or CRD holds, when those are made again), and everything else
// a spec made is removed. So the state is the fixture's either way, and a
// reset costs what the test changed rather than the fixture's size.
func (cp *controlPlane) resetTo(ctx context.Context, texts [][]byte) error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	objs, err := parseFixtures(texts)
	if err != nil {
		return fixtureError{err}
	}
	canon, err := canonical(objs)
	if err != nil {
		return fixtureError{err}
	}
	all, err := cp.everything(ctx)
	if err != nil {
		return err
	}
	var keep map[string]loaded
	if cp.loadedFixture != nil && equalStrings(canon, cp.loadedFixture) {
		keep = cp.unchanged(all)
	}
	cp.loadedFixture = nil
	if err := cp.removeAll(ctx, all, keep); err != nil {
		return err
	}
	if err := cp.place(ctx, objs, keep); err != nil {
		return fixtureError{err}
	}
	return nil
}

// fixtureError is a reset's failure to load its fixtures (the state was
// removed): the fixtures' fault, not the server's.
type fixtureError struct{ error }

func (e fixtureError) Unwrap() error { return e.error }

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// unchanged is what the last load made and still is as it was made: same
// resourceVersion, not being deleted, its namespace, its CRD and its owners
// (those the fixture made) unchanged too. By key.
func (cp *controlPlane) unchanged(all []listed) map[string]loaded {
	live := map[string]*unstructured.Unstructured{}
	for i := range all {
		live[all[i].key] = &all[i].obj
	}
	made := map[string]bool{}
	byUID := map[string]string{}
	for _, l := range cp.loaded {
		made[l.key] = true
		if l.fixtureUID != "" {
			byUID[l.fixtureUID] = l.key
		}
	}
	keep := map[string]loaded{}
	for _, l := range cp.loaded {
		if o, ok := live[l.key]; ok && o.GetResourceVersion() == l.rv && o.GetDeletionTimestamp() == nil {
			keep[l.key] = l
		}
	}
	nsKey := func(ns string) string {
		return objectKey(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}, "", ns)
	}
	crdKey := func(name string) string {
		return objectKey(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}, "", name)
	}
	// what depends on something made again is made again
	for changed := true; changed; {
		changed = false
		for key, l := range keep {
			var needs []string
			if l.namespace != "" {
				needs = append(needs, nsKey(l.namespace))
			}
			if l.crd != "" {
				needs = append(needs, crdKey(l.crd))
			}
			for _, u := range l.owners {
				needs = append(needs, byUID[u])
			}
			for _, n := range needs {
				if _, kept := keep[n]; made[n] && !kept {
					delete(keep, key)
					changed = true
					break
				}
			}
		}
	}
	return keep
}

// removeAll removes every object of all (everything, listed) that is
// neither in the baseline nor in keep: namespaced ones first, finalizers
// emptied (no controller runs here to honour them, so each is gone when its
// delete answers), then the CRDs and the namespaces, finalized by hand as the
// namespace controller would, and waited for. The caller holds cp.mu.
func (cp *controlPlane) removeAll(ctx context.Context, all []listed, keep map[string]loaded) error {
	var objects, namespaces, crds []listed
	for _, l := range all {
		if _, base := cp.baseline[l.key]; base {
			continue
		}
		if _, kept := keep[l.key]; kept {
			continue
		}
		switch {
		case l.res.gvr.Resource == "namespaces" && l.res.gvr.Group == "":
			namespaces = append(namespaces, l)
		case l.res.gvr.Resource == "customresourcedefinitions":
			crds = append(crds, l)
		default:
			objects = append(objects, l)
		}
	}
	// objects in namespaces and cluster-scoped objects, then CRDs, then namespaces
	if err := parallel(len(objects), func(i int) error { return cp.remove(ctx, objects[i]) }); err != nil {
		return err
	}
	if err := parallel(len(crds), func(i int) error { return cp.remove(ctx, crds[i]) }); err != nil {
		return err
	}
	if err := parallel(len(namespaces), func(i int) error {
		l := namespaces[i]
		if err := cp.remove(ctx, l); err != nil {
			return err
		}
		ns := &unstructured.Unstructured{}
		ns.SetAPIVersion("v1")
		ns.SetKind("Namespace")
		ns.SetName(l.obj.GetName())
		_ = unstructured.SetNestedStringSlice(ns.Object, []string{}, "spec", "finalizers")
		_, err := cp.dyn.Resource(l.res.gvr).Update(ctx, ns, metav1.UpdateOptions{}, "finalize")
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("finalizing namespace %s: %w", l.obj.GetName(), err)
		}
		return nil
	}); err != nil {
		return err
	}
	gone := append(crds, namespaces...)
	if err := parallel(len(gone), func(i int) error { return cp.waitGone(ctx, gone[i]) }); err != nil {
		return err
	}
	return cp.restoreRealCRDs(ctx)
}

func (cp *controlPlane) remove(ctx context.Context, l listed) error {
	client := cp.dyn.Resource(l.res.gvr).Namespace(l.obj.GetNamespace())
	if len(l.obj.GetFinalizers()) > 0 {
		patch := []byte(`{"metadata":{"finalizers":null}}`)
		if _, err := client.Patch(ctx, l.obj.GetName(), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("emptying the finalizers of %s: %w", l.key, err)
		}
	}
	// no grace period: no kubelet runs here to end a bound pod's
	zero := int64(0)
	err := client.Delete(ctx, l.obj.GetName(), metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsMethodNotSupported(err) {
		return fmt.Errorf("deleting %s: %w", l.key, err)
	}
	return nil
}

func (cp *controlPlane) waitGone(ctx context.Context, l listed) error {
	client := cp.dyn.Resource(l.res.gvr).Namespace(l.obj.GetNamespace())
	return wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := client.Get(ctx, l.obj.GetName(), metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}
