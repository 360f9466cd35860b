// The inventory: which resources the server serves, what existed before
// any fixture (the baseline), and every object a spec may look at.

package main

import (
	"context"
	"fmt"
	"sort"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// resources lists every resource of the server's preferred versions that
// supports all the given verbs.
func (cp *controlPlane) resources(verbs ...string) ([]resource, error) {
	lists, err := cp.disco.ServerPreferredResources()
	if err != nil {
		return nil, err
	}
	var out []resource
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			return nil, err
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !hasVerbs(r.Verbs, verbs) {
				continue
			}
			// events.k8s.io/v1 events are the core events again
			if gv.Group == "events.k8s.io" {
				continue
			}
			out = append(out, resource{gv.WithResource(r.Name), r.Namespaced, r.Kind})
		}
	}
	return out, nil
}

type resource struct {
	gvr        schema.GroupVersionResource
	namespaced bool
	kind       string
}

func hasVerbs(have []string, want []string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			if h == w {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// isIdentityLease tells the API server's own heartbeat: the kube-system
// Lease with the apiserver.kubernetes.io/identity label, which the server
// renews every 10 s. No client writes it, so everything() leaves it out:
// /_fake/objects would otherwise show it as changed whenever a renewal fell
// between two reads, and a reset must not delete it.
func isIdentityLease(gvr schema.GroupVersionResource, o *unstructured.Unstructured) bool {
	if gvr.Group != "coordination.k8s.io" || gvr.Resource != "leases" || o.GetNamespace() != metav1.NamespaceSystem {
		return false
	}
	_, ok := o.GetLabels()["apiserver.kubernetes.io/identity"]
	return ok
}

func objectKey(gvr schema.GroupVersionResource, ns, name string) string {
	return gvr.GroupResource().String() + "/" + ns + "/" + name
}

// takeBaseline records what exists before any fixture: the server's own
// objects (RBAC bootstrap roles, priority levels, the default namespaces) and
// the real CRDs. A reset keeps them; /_fake/objects hides them while they are
// as they were.
func (cp *controlPlane) takeBaseline(ctx context.Context) error {
	objs, err := cp.everything(ctx)
	if err != nil {
		return err
	}
	cp.baseline = map[string]string{}
	for _, o := range objs {
		cp.baseline[o.key] = o.obj.GetResourceVersion()
	}
	return nil
}

type listed struct {
	key string
	res resource
	obj unstructured.Unstructured
}

func (cp *controlPlane) everything(ctx context.Context) ([]listed, error) {
	res, err := cp.resources("list")
	if err != nil {
		return nil, err
	}
	var out []listed
	for _, r := range res {
		l, err := cp.dyn.Resource(r.gvr).List(ctx, metav1.ListOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) || apierrors.IsMethodNotSupported(err) {
				continue
			}
			return nil, fmt.Errorf("listing %s: %w", r.gvr, err)
		}
		for _, o := range l.Items {
			if isIdentityLease(r.gvr, &o) {
				continue
			}
			if o.GetAPIVersion() == "" {
				o.SetAPIVersion(r.gvr.GroupVersion().String())
			}
			if o.GetKind() == "" {
				o.SetKind(r.kind)
			}
			out = append(out, listed{objectKey(r.gvr, o.GetNamespace(), o.GetName()), r, o})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].key < out[j].key })
	return out, nil
}

// objects is every object a fixture or a client made or changed.
func (cp *controlPlane) objects(ctx context.Context) ([]unstructured.Unstructured, error) {
	all, err := cp.everything(ctx)
	if err != nil {
		return nil, err
	}
	var out []unstructured.Unstructured
	for _, l := range all {
		if rv, ok := cp.baseline[l.key]; ok && rv == l.obj.GetResourceVersion() {
			continue
		}
		out = append(out, l.obj)
	}
	return out, nil
}
