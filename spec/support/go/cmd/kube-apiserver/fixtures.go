// Fixtures: parsing the fake's fixture files and creating their objects on
// the real server.

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
)

// parseFixtures accepts what the fake accepts: a v1 List, a bare array of
// objects, or an array of Lists (the body of a reset).
func parseFixtures(texts [][]byte) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	var add func(raw json.RawMessage) error
	add = func(raw json.RawMessage) error {
		raw = bytes.TrimSpace(raw)
		if len(raw) > 0 && raw[0] == '[' {
			var items []json.RawMessage
			if err := json.Unmarshal(raw, &items); err != nil {
				return err
			}
			for _, it := range items {
				if err := add(it); err != nil {
					return err
				}
			}
			return nil
		}
		var obj map[string]any
		if err := json.Unmarshal(raw, &obj); err != nil {
			return err
		}
		if items, ok := obj["items"]; ok && obj["kind"] == "List" || ok && obj["kind"] == nil {
			b, _ := json.Marshal(items)
			if string(b) == "null" {
				return nil
			}
			return add(b)
		}
		u := &unstructured.Unstructured{Object: obj}
		if u.GetKind() == "" || u.GetAPIVersion() == "" || u.GetName() == "" {
			return fmt.Errorf("a fixture object needs apiVersion, kind and metadata.name: %s", truncate(string(raw), 200))
		}
		out = append(out, u)
		return nil
	}
	for _, t := range texts {
		if err := add(t); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// loaded is what a load made of one object (a fixture's, or a namespace
// it uses without listing it): enough for a reset to the same fixtures to
// keep the object when nothing changed it since.
type loaded struct {
	key        string   // objectKey of the live object
	rv         string   // its resourceVersion once loaded, status included
	fixtureUID string   // the uid the fixture gave it, if any
	newUID     string   // the uid the server gave it
	owners     []string // fixture uids its ownerReferences name that are fixture objects'
	namespace  string   // its namespace; "" when cluster-scoped
	crd        string   // the name of the CRD that serves it, for custom resources
}

// loadParallelism bounds the requests a load or a reset sends at once: the
// API server answers several at a time even on two cores, so a fixture of
// hundreds of objects loads in a fraction of the time one at a time takes.
const loadParallelism = 8

// parallel calls fn(i) for i in [0, n), at most loadParallelism at once,
// and returns the first error.
func parallel(n int, fn func(i int) error) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	sem := make(chan struct{}, loadParallelism)
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			if err := fn(i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	return first
}

// canonical is the fixture as a list of its objects' JSON (keys sorted), to
// tell a reset to the fixtures already loaded from one to others.
func canonical(objs []*unstructured.Unstructured) ([]string, error) {
	out := make([]string, len(objs))
	for i, o := range objs {
		b, err := json.Marshal(o.Object)
		if err != nil {
			return nil, err
		}
		out[i] = string(b)
	}
	return out, nil
}

// load creates the fixture objects: namespaces and CRDs first (a CRD the
// control plane installed gives way to the real one), owners before what
// they own, each object's status kept as given. The server assigns its own
// uids; an ownerReference that names a fixture's uid is pointed at that
// object's new uid, so a deliberate mismatch stays a mismatch.
//
// An object given with a metadata.deletionTimestamp is being deleted: a
// server sets that field itself and ignores it on create, so the object is
// created and then deleted, once everything else exists; its finalizers
// keep it, now with the server's deletionTimestamp (the time of the load,
// not the fixture's). Without finalizers no real server can hold such an
// object: the load fails rather than store one that is not being deleted.
func (cp *controlPlane) load(ctx context.Context, texts [][]byte) error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	objs, err := parseFixtures(texts)
	if err != nil {
		return err
	}
	return cp.place(ctx, objs, nil)
}

// place creates the fixture objects (all but those in keep, which stay as
// they are) and records what it made for the next reset.
func (cp *controlPlane) place(ctx context.Context, objs []*unstructured.Unstructured, keep map[string]loaded) error {
	canon, err := canonical(objs)
	if err != nil {
		return err
	}
	cp.uids = map[string]string{}
	cp.loaded = nil
	for _, l := range keep {
		if l.fixtureUID != "" {
			cp.uids[l.fixtureUID] = l.newUID
		}
	}
	var crds, namespaces, rest []*unstructured.Unstructured
	needNS := map[string]bool{}
	for _, o := range objs {
		if err := terminatingAllowed(o); err != nil {
			return err
		}
		switch {
		case o.GetKind() == "FakeDeny" || o.GetKind() == "FakeAllow":
			return fmt.Errorf("%s items are rules of the fake API server; the real one has RBAC instead", o.GetKind())
		case o.GetKind() == "CustomResourceDefinition":
			if !cp.realCRDs[o.GetName()] {
				crds = append(crds, o)
			}
		case o.GetKind() == "Namespace" && o.GetAPIVersion() == "v1":
			namespaces = append(namespaces, o)
			needNS[o.GetName()] = false
		default:
			rest = append(rest, o)
		}
	}
	nsGVR := schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	// put creates one object unless it is kept; either way it is recorded
	var custom map[string]bool // names of the CRDs served, once the fixture's are
	put := func(o *unstructured.Unstructured, gvr schema.GroupVersionResource, namespaced, mayExist bool) error {
		ns := ""
		if namespaced {
			ns = o.GetNamespace()
		}
		key := objectKey(gvr, ns, o.GetName())
		l, kept := keep[key]
		if !kept {
			created, err := cp.create(ctx, o, gvr, mayExist)
			if err != nil {
				return err
			}
			if _, base := cp.baseline[key]; base {
				return nil // a namespace of the server's own: never removed
			}
			l = loaded{key: key, rv: created.GetResourceVersion(), fixtureUID: string(o.GetUID()),
				newUID: string(created.GetUID()), namespace: ns}
			if name := gvr.Resource + "." + gvr.Group; custom[name] {
				l.crd = name
			}
			for _, ref := range o.GetOwnerReferences() {
				l.owners = append(l.owners, string(ref.UID))
			}
		}
		cp.uidMu.Lock()
		cp.loaded = append(cp.loaded, l)
		cp.uidMu.Unlock()
		return nil
	}
	if err := parallel(len(namespaces), func(i int) error {
		return put(namespaces[i], nsGVR, false, false)
	}); err != nil {
		return err
	}
	if err := parallel(len(crds), func(i int) error {
		if err := put(crds[i], crdGVR, false, false); err != nil {
			return err
		}
		if err := cp.waitServed(ctx, crds[i].GetName()); err != nil {
			return err
		}
		// the API server writes a new CRD's status (Established) after
		// create: what the next reset compares with is the CRD once served
		got, err := cp.ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crds[i].GetName(), metav1.GetOptions{})
		if err != nil {
			return err
		}
		key := objectKey(crdGVR, "", crds[i].GetName())
		cp.uidMu.Lock()
		for j := range cp.loaded {
			if cp.loaded[j].key == key {
				cp.loaded[j].rv = got.ResourceVersion
			}
		}
		cp.uidMu.Unlock()
		return nil
	}); err != nil {
		return err
	}
	crdList, err := cp.ext.ApiextensionsV1().CustomResourceDefinitions().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	custom = map[string]bool{}
	for _, c := range crdList.Items {
		custom[c.Name] = true
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(cp.disco))
	type placed struct {
		obj        *unstructured.Unstructured
		gvr        schema.GroupVersionResource
		namespaced bool
	}
	var pending, terminating []placed
	for _, o := range namespaces {
		if o.GetDeletionTimestamp() != nil {
			terminating = append(terminating, placed{o, nsGVR, false})
		}
	}
	for _, o := range crds {
		if o.GetDeletionTimestamp() != nil {
			terminating = append(terminating, placed{o, crdGVR, false})
		}
	}
	fixtureUIDs := map[string]bool{}
	for _, o := range rest {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("%s %s: %w", gvk, o.GetName(), err)
		}
		namespaced := m.Scope.Name() == meta.RESTScopeNameNamespace
		if namespaced {
			if o.GetNamespace() == "" {
				o.SetNamespace("default")
			}
			if _, listed := needNS[o.GetNamespace()]; !listed {
				needNS[o.GetNamespace()] = true
			}
		}
		if uid := string(o.GetUID()); uid != "" {
			fixtureUIDs[uid] = true
		}
		pending = append(pending, placed{o, m.Resource, namespaced})
		if o.GetDeletionTimestamp() != nil {
			terminating = append(terminating, placed{o, m.Resource, namespaced})
		}
	}
	// Namespaces the fixture uses without listing them are made for it.
	var implicit []*unstructured.Unstructured
	for ns, unlisted := range needNS {
		if !unlisted {
			continue
		}
		o := &unstructured.Unstructured{}
		o.SetAPIVersion("v1")
		o.SetKind("Namespace")
		o.SetName(ns)
		implicit = append(implicit, o)
	}
	if err := parallel(len(implicit), func(i int) error {
		return put(implicit[i], nsGVR, false, true)
	}); err != nil {
		return err
	}
	// Owners first: an object waits while it names the uid of a fixture
	// object not yet created. A cycle is created as given.
	for len(pending) > 0 {
		var ready, next []placed
		for _, p := range pending {
			if cp.waitsForOwner(p.obj, fixtureUIDs) {
				next = append(next, p)
			} else {
				ready = append(ready, p)
			}
		}
		if len(ready) == 0 {
			ready, next = next, nil
		}
		if err := parallel(len(ready), func(i int) error {
			return put(ready[i].obj, ready[i].gvr, ready[i].namespaced, false)
		}); err != nil {
			return err
		}
		pending = next
	}
	for _, p := range terminating {
		client := cp.dyn.Resource(p.gvr).Namespace(p.obj.GetNamespace())
		if err := client.Delete(ctx, p.obj.GetName(), metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("%s %s/%s: deleting it for its deletionTimestamp: %w", p.gvr.Resource, p.obj.GetNamespace(), p.obj.GetName(), err)
		}
	}
	cp.loadedFixture = canon
	return nil
}

// terminatingAllowed refuses a fixture object that is being deleted
// (metadata.deletionTimestamp) with nothing to keep it: a real server
// removes such an object at once. A namespace is kept by its spec.finalizers,
// which the server gives every namespace.
func terminatingAllowed(o *unstructured.Unstructured) error {
	if o.GetDeletionTimestamp() == nil || len(o.GetFinalizers()) > 0 {
		return nil
	}
	if o.GetKind() == "Namespace" && o.GetAPIVersion() == "v1" {
		return nil
	}
	return fmt.Errorf("%s %s/%s has a deletionTimestamp and no finalizers: a real server removes such an object at once (a fake-only fixture)",
		o.GetKind(), o.GetNamespace(), o.GetName())
}

func (cp *controlPlane) waitsForOwner(o *unstructured.Unstructured, fixtureUIDs map[string]bool) bool {
	cp.uidMu.Lock()
	defer cp.uidMu.Unlock()
	for _, ref := range o.GetOwnerReferences() {
		uid := string(ref.UID)
		if _, done := cp.uids[uid]; fixtureUIDs[uid] && !done && uid != string(o.GetUID()) {
			return true
		}
	}
	return false
}

// create makes one fixture object, then writes its status through the
// status subresource when create dropped it; it returns the object as
// stored at the end.
func (cp *controlPlane) create(ctx context.Context, o *unstructured.Unstructured, gvr schema.GroupVersionResource, mayExist bool) (*unstructured.Unstructured, error) {
	o = o.DeepCopy()
	oldUID := string(o.GetUID())
	for _, f := range []string{"uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "selfLink", "deletionTimestamp", "deletionGracePeriodSeconds"} {
		unstructured.RemoveNestedField(o.Object, "metadata", f)
	}
	refs := o.GetOwnerReferences()
	cp.uidMu.Lock()
	for i := range refs {
		if n, ok := cp.uids[string(refs[i].UID)]; ok {
			refs[i].UID = types.UID(n)
		}
	}
	cp.uidMu.Unlock()
	if len(refs) > 0 {
		o.SetOwnerReferences(refs)
	}
	status, hasStatus, _ := unstructured.NestedFieldCopy(o.Object, "status")
	client := cp.dyn.Resource(gvr).Namespace(o.GetNamespace())
	created, err := client.Create(ctx, o, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) && (mayExist || gvr.Resource == "namespaces") {
		created, err = client.Get(ctx, o.GetName(), metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s/%s: %w", gvr.Resource, o.GetNamespace(), o.GetName(), err)
	}
	if oldUID != "" {
		cp.uidMu.Lock()
		cp.uids[oldUID] = string(created.GetUID())
		cp.uidMu.Unlock()
	}
	// The server owns the status of namespaces and CRDs.
	if hasStatus && gvr.Resource != "namespaces" && gvr.Resource != "customresourcedefinitions" {
		got, _, _ := unstructured.NestedFieldCopy(created.Object, "status")
		if !equality.Semantic.DeepEqual(got, status) {
			if err := unstructured.SetNestedField(created.Object, status, "status"); err != nil {
				return nil, err
			}
			updated, err := client.UpdateStatus(ctx, created, metav1.UpdateOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("status of %s %s/%s: %w", gvr.Resource, o.GetNamespace(), o.GetName(), err)
			}
			if err == nil {
				created = updated
			}
		}
	}
	return created, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
